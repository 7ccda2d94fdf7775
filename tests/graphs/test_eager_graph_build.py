"""The eager fallback that launches the builds a graph holds (``EagerBuild.GRAPH``, the
default for the library's builders): steps of every composition that no graph holds, run
through ``GraphManager.run`` and through the in-place ``launch``, give through the gather
consumer exactly what the step-alone oracle says every token reads, and what the reference
eager build gives -- on torch and Triton kernels (interpreted on CPU, compiled on the GPU,
with more steps there)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.gather_world import gather_world
from helpers.mixed_steps import CONFIGS
from helpers.support import DEVICE, READER_BACKEND, _t, host_steps, quiet
from hypothesis import given, settings

from staticattn.errors import GraphError
from staticattn.graphs import EagerBuild, EagerReason, GraphManager, StagingGuard
from staticattn.graphs.captured import RunResult
from staticattn.reference import checksums


def _examples(backend: str) -> int:
    if DEVICE == "cuda":
        return 200
    return 40 if backend == "torch" else 3  # interpreted Triton: one program per token


def _write_tables(inputs, step) -> None:
    r = step.num_reqs
    inputs.block_table[:r].copy_(_t(step.block_table))
    if step.swa_block_table is not None:
        inputs.swa_block_table[:r].copy_(_t(step.swa_block_table))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_graph_build_fallback_equals_the_oracle_and_the_reference(backend, name):
    cfg = CONFIGS[name](device=DEVICE, kernel_backend=backend)
    arena, inputs, builders, consumer, caches = gather_world(cfg, backend=READER_BACKEND)
    gm = GraphManager(arena, inputs, builders, consumer, quiet())
    assert gm.eager_build is EagerBuild.GRAPH
    fingerprint = arena.fingerprint()

    @settings(max_examples=_examples(backend), deadline=None)
    @given(host_steps(cfg, max_seq_len=4096))
    def check(step):
        _write_tables(inputs, step)
        args = (step.query_lens, step.seq_lens, step.slot_mapping)
        res = gm.run(*args)
        assert (res.mode, res.reason) == ("eager", EagerReason.NOT_CAPTURED)
        got = res.outputs.tolist()
        assert got == checksums.expected(cfg, step, *caches, step.num_tokens)
        assert gm.run(*args, eager=EagerBuild.GRAPH).outputs.tolist() == got
        assert gm.run(*args, eager=EagerBuild.REFERENCE).outputs.tolist() == got
        # The same step written into the in-place views.
        views = gm.begin_step()
        k, t = step.num_reqs, step.num_tokens
        views.seq_lens[:k], views.slot_mapping[:t] = step.seq_lens, step.slot_mapping
        views.query_start_loc[: k + 1] = np.concatenate(([0], np.cumsum(step.query_lens)))
        assert gm.launch(k, t).tolist() == got

    check()
    assert arena.fingerprint() == fingerprint
    # Per step: run and launch fell back, the two forced runs were asked for.
    assert gm.stats.eager[EagerReason.FORCED] == gm.stats.eager[EagerReason.NOT_CAPTURED] > 0


def test_the_eager_build_is_chosen_and_checked():
    from helpers.toy import ToyBuilder, ToyStep, toy_expected

    from staticattn.arena import ArenaConfig
    from staticattn.builders import make_arena

    cfg = ArenaConfig.deepseek_v4(max_num_seqs=8, max_num_batched_tokens=64,
                                  max_model_len=1024, device=DEVICE)

    b = ToyBuilder()
    arena, inputs = make_arena(cfg, [b])
    step = ToyStep(cfg, arena.device)
    assert GraphManager(arena, inputs, [b], step, quiet()).eager_build is EagerBuild.GRAPH
    ref = GraphManager(arena, inputs, [b], step, quiet(eager_build=EagerBuild.REFERENCE))
    assert ref.eager_build is EagerBuild.REFERENCE
    res = ref.run([2, 2], [9, 40], np.arange(4))
    assert isinstance(res, RunResult) and res.reason is EagerReason.NOT_CAPTURED
    # Either guard runs the same eager step (the event only moves inside captured graphs).
    q, lens, slots = [2, 2], [9, 40], np.arange(4)
    at_end = GraphManager(arena, inputs, [b], step,
                          quiet(staging_guard=StagingGuard.STEP))
    first = at_end.run(q, lens, slots, eager=EagerBuild.GRAPH).outputs.tolist()
    assert first == toy_expected(q, lens)
    assert ref.run(q, lens, slots, eager=EagerBuild.GRAPH).outputs.tolist() == first
    # Recorded launches need CUDA, Triton kernels and the graph builds.
    assert ref.eager.recorded_launches is None
    off = GraphManager(arena, inputs, [b], step, quiet(recorded_launches=0))
    assert off.eager.recorded_launches is None
    if DEVICE == "cpu":
        assert GraphManager(arena, inputs, [b], step, quiet()).eager.recorded_launches is None
    # The old vocabulary is gone: a string or a bool is refused, whatever the path.
    for eager in ("fast", "graph", "reference", True, False):
        with pytest.raises(GraphError, match="eager must be None, EagerBuild"):
            ref.run([2, 2], [9, 40], np.arange(4), eager=eager)
    only_build = GraphManager(arena, inputs, [_Reference(b)], step, quiet())
    assert only_build.eager_build is EagerBuild.REFERENCE
    with pytest.raises(GraphError, match="build_decode and build_mixed"):
        GraphManager(arena, inputs, [_Reference(b)], step,
                     quiet(eager_build=EagerBuild.GRAPH))


class _Reference:
    """A builder with only the reference ``build`` (no graph builds)."""

    def __init__(self, inner):
        self.inner = inner
        self.name = inner.name
        self.arena = inner.arena

    def build(self, batch):
        return self.inner.build(batch)
