"""The graph manager's options and construction: ``GraphOptions`` checked when made, one enum
per choice (the eager build, the staging guard) with no string spelling left, the options
reaching every part, and the constructor refusing what it cannot work with before anything
is built."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers.support import DEVICE
from helpers.toy import ToyBuilder, ToyStep, toy_expected

from staticattn import EagerBuild, GraphOptions, StagingGuard
from staticattn.arena import ArenaConfig
from staticattn.builders import make_arena
from staticattn.errors import ArenaError, GraphError
from staticattn.graphs import GraphManager


def _cfg() -> ArenaConfig:
    return ArenaConfig.deepseek_v4(max_num_seqs=8, max_num_batched_tokens=64,
                                   max_model_len=1024, device=DEVICE)


def _world():
    cfg = _cfg()
    b = ToyBuilder()
    arena, inputs = make_arena(cfg, [b])
    return cfg, arena, inputs, b, ToyStep(cfg, arena.device)


@pytest.mark.parametrize("field, value", [
    ("validate", "yes"), ("validate", 1), ("progress", None), ("time_gpu", 0),
    ("raw_launch", "on"), ("branch_builds", 1), ("num_kv_blocks", 0), ("num_kv_blocks", 2.0),
    ("num_kv_blocks", True), ("eager_build", "graph"), ("eager_build", "reference"),
    ("eager_build", True), ("recorded_launches", -1), ("recorded_launches", 2.0),
    ("recorded_launches", None), ("recorded_launches", True), ("staging_guard", "step"),
    ("staging_guard", "staging"), ("staging_guard", None),
])
def test_a_bad_option_is_refused_by_name(field, value):
    with pytest.raises(GraphError, match=field):
        GraphOptions(**{field: value})


def test_options_are_frozen_and_name_their_choices_once():
    options = GraphOptions(num_kv_blocks=512, eager_build=EagerBuild.REFERENCE,
                           recorded_launches=0, staging_guard=StagingGuard.STEP)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.validate = False
    assert GraphOptions() == GraphOptions(True, True, False, None, True, None, 256,
                                          StagingGuard.STAGING)
    # The command line's strings name the members, and nothing else does.
    assert EagerBuild("graph") is EagerBuild.GRAPH and StagingGuard("step") is StagingGuard.STEP
    assert {e.value for e in EagerBuild} == {"graph", "reference"}
    assert {g.value for g in StagingGuard} == {"staging", "step"}


def test_the_options_reach_every_part():
    cfg, arena, inputs, b, step = _world()
    gm = GraphManager(arena, inputs, [b], step, GraphOptions(
        validate=False, progress=False, raw_launch=False, num_kv_blocks=4,
        staging_guard=StagingGuard.STEP, eager_build=EagerBuild.REFERENCE))
    assert gm.validate is False and gm.checks.validate is False
    assert gm.capturer.progress is False and gm.capturer.raw_launch is False
    assert gm.capturer.marks_after_staging is False
    assert gm.eager.build is EagerBuild.REFERENCE and gm.eager.recorded_launches is None
    assert gm.slot_bound == 4 * cfg.swa_block_size == gm.checks.views.slot_bound
    assert gm.time_gpu is False  # asked for or not, only a CUDA arena times
    default = GraphManager(arena, inputs, [b], step, GraphOptions(num_kv_blocks=8))
    assert default.options == GraphOptions(num_kv_blocks=8)
    assert default.capturer.marks_after_staging
    assert default.slot_bound == 8 * cfg.swa_block_size == default.checks.slot_bound
    assert default.validate and default.checks.validate
    assert default.block_ids.num_kv_blocks == 8
    # Without a pool size nothing bounds a slot: validating needs one, not validating not.
    with pytest.raises(GraphError, match=r"GraphOptions\(num_kv_blocks=...\) is required"):
        GraphManager(arena, inputs, [b], step)
    unchecked = GraphManager(arena, inputs, [b], step, GraphOptions(validate=False))
    assert unchecked.slot_bound is None and unchecked.block_ids is None


def test_validate_switches_both_step_apis():
    cfg, arena, inputs, b, step = _world()
    blind = GraphManager(arena, inputs, [b], step, GraphOptions(progress=False, validate=False))
    with pytest.raises(GraphError, match="num_kv_blocks"):
        blind.validate = True
    assert blind.validate is False
    gm = GraphManager(arena, inputs, [b], step,
                      GraphOptions(progress=False, validate=False, num_kv_blocks=8))
    n = cfg.next_n
    views = gm.begin_step()
    views.seq_lens[:1], views.slot_mapping[:n] = [cfg.max_model_len + 1], np.arange(n)
    gm.validate = True
    with pytest.raises(Exception, match="max_model_len"):
        gm.launch(1)
    with pytest.raises(Exception, match="max_model_len"):
        gm.run([n], [cfg.max_model_len + 1], np.arange(n))
    gm.validate = False
    assert gm.run([n], [5], np.arange(n)).outputs.tolist() == toy_expected([n], [5])
    assert gm.checks.validate is False


def test_the_constructor_refuses_what_it_cannot_work_with():
    cfg, arena, inputs, b, step = _world()
    with pytest.raises(GraphError, match="step must be callable"):
        GraphManager(arena, inputs, [b], "step")
    with pytest.raises(GraphError, match="at least one builder"):
        GraphManager(arena, inputs, [], step)
    with pytest.raises(GraphError, match="options must be a GraphOptions"):
        GraphManager(arena, inputs, [b], step, {"progress": False})
    with pytest.raises(TypeError):  # the options are one object, not keywords
        GraphManager(arena, inputs, [b], step, progress=False)
    with pytest.raises(ArenaError, match="'toy' is bound to no arena"):
        GraphManager(arena, inputs, [ToyBuilder()], step)
    other_arena, other_inputs = make_arena(cfg, [ToyBuilder()])
    with pytest.raises(ArenaError, match="'toy' is bound to Arena") as info:
        GraphManager(other_arena, other_inputs, [b], step)
    assert repr(arena) in str(info.value) and repr(other_arena) in str(info.value)
    with pytest.raises(GraphError, match="inputs are not the step inputs"):
        GraphManager(arena, other_inputs, [b], step)
    pool = GraphOptions(progress=False, num_kv_blocks=8)
    for bad in (cfg.max_model_len + 1, 0, True, 64.0):
        with pytest.raises(GraphError, match="context bucket"):
            GraphManager(arena, inputs, [b], step, pool, contexts=[bad])
    gm = GraphManager(arena, inputs, [b], step, pool, contexts=[64])
    assert gm.contexts == [64, cfg.max_model_len] == gm.capturer.contexts
    assert GraphManager(arena, inputs, [b], step, pool).contexts == [cfg.max_model_len]


def test_a_closed_manager_refuses_every_step_api():
    cfg, arena, inputs, b, step = _world()
    gm = GraphManager(arena, inputs, [b], step, GraphOptions(progress=False, num_kv_blocks=8))
    n = cfg.next_n
    views = gm.begin_step()
    views.seq_lens[:1], views.slot_mapping[:n] = [5], np.arange(n)
    gm.close()
    assert gm.closed
    for call in (lambda: gm.run([n], [5], np.arange(n)), lambda: gm.launch(1),
                 lambda: gm.launch(0), gm.begin_step, lambda: gm.capture([n]),
                 lambda: gm.graph_for(n)):
        with pytest.raises(GraphError, match="closed"):
            call()
