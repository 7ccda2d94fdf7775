"""A kind of step the package does not ship, added in this file alone: one key, one
dispatcher rule, and the graphs that build it -- then routed, replayed, counted and refused
like the built-in kinds. (On CPU its graphs are emulated by their bodies run eagerly; on a
GPU they are captured through the manager's one capture path.)"""

from __future__ import annotations

import enum

import numpy as np
import pytest
from helpers.emulated_graphs import emulated
from helpers.support import DEVICE, quiet
from helpers.toy import ToyBuilder, ToyStep, toy_expected

from staticattn.arena import ArenaConfig
from staticattn.builders import make_arena
from staticattn.errors import GraphError
from staticattn.graphs import EagerReason, GraphKind, GraphManager, StepKey
from staticattn.graphs.capturer import GraphSpec
from staticattn.graphs.dispatch import KindRule, Lookup


class ToyKind(enum.Enum):
    """The key: a step of one prefilling request (a prompt chunk alone in its step)."""

    ONE_PREFILL = "one-prefill"


#: The rule: graphs found by tokens; past them, the token buckets serve the step.
RULE = KindRule(Lookup.BY_TOKENS, fallback=GraphKind.MIXED)


def _spec(gm, size: int) -> GraphSpec:
    """The builds: one request slot, staged and built as a step of any composition."""
    cap = gm.capturer
    return GraphSpec(ToyKind.ONE_PREFILL, size, 1,
                     lambda: cap.stage_warm_up(GraphKind.MIXED, 1, size),
                     lambda: cap.body(GraphKind.MIXED, 1, size), cap.context_len)


def _manager(sizes=(16, 64), buckets=()):
    cfg = ArenaConfig.deepseek_v4(max_num_seqs=8, max_num_batched_tokens=128,
                                  max_model_len=1024, device=DEVICE)
    b = ToyBuilder()
    arena, inputs = make_arena(cfg, [b])
    gm = GraphManager(arena, inputs, [b], ToyStep(cfg, arena.device), quiet())
    gm.dispatcher.register(ToyKind.ONE_PREFILL, RULE)
    specs = [_spec(gm, size) for size in sizes]
    specs += [gm.capturer.spec(GraphKind.MIXED, gm.capturer.context_len, t) for t in buckets]
    if DEVICE == "cuda":
        gm.capturer.capture_each(specs, gm.dispatcher)
    else:
        gm.dispatcher.add(*(emulated(spec) for spec in specs))
    return gm


def _one_prefill(gm, prompt: int, context: int):
    """The front end of the new kind: its key, the dispatcher's answer, the manager's own
    checks, staging and replay."""
    q, s = np.array([prompt]), np.array([context + prompt])
    slots = np.arange(prompt)
    g, reason = gm.dispatcher.route(StepKey(ToyKind.ONE_PREFILL, prompt, 1, prompt))
    if g is None:
        return None, reason
    gm.runner.stage(q, s, slots, gm.runner.check(q, s, slots))
    out = gm.runner.replay(g, prompt).outputs
    assert out.tolist() == toy_expected(q, s)
    return g, None


def test_a_new_kind_routes_replays_and_counts_like_the_built_in_ones():
    gm = _manager()
    for prompt, size in ((3, 16), (16, 16), (17, 64), (64, 64)):
        g, _ = _one_prefill(gm, prompt, 100)
        assert (g.kind, g.size) == (ToyKind.ONE_PREFILL, size), prompt
    assert gm.stats.replays == {ToyKind.ONE_PREFILL: 4}
    g, reason = _one_prefill(gm, 65, 100)  # past its graphs, and no token bucket captured
    assert g is None and reason is EagerReason.TOO_LARGE
    assert "one-prefill" in gm.describe()


def test_past_its_graphs_the_fallback_kind_serves_the_step():
    gm = _manager(sizes=(16,), buckets=(128,))
    g, _ = _one_prefill(gm, 40, 7)
    assert (g.kind, g.size) == (GraphKind.MIXED, 128)
    assert gm.stats.replays == {GraphKind.MIXED: 1}


def test_a_kind_without_graphs_is_not_captured_and_a_kind_is_served_once():
    gm = _manager(sizes=())
    g, reason = _one_prefill(gm, 5, 5)
    assert g is None and reason is EagerReason.NOT_CAPTURED
    with pytest.raises(GraphError, match="already served"):
        gm.dispatcher.register(ToyKind.ONE_PREFILL, RULE)
