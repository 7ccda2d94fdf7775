"""On the GPU: recorded launches (``graphs/recorded_launches.py``) run a step's graph builds
exactly as the builds themselves do.

* View for view: per config, random steps of every composition; each step's graph builds
  run plainly, then a different step's, then the first step's through the recorded
  launches three times (noted, recorded, a hit): every metadata view equals the plain
  builds' bit for bit, so a record that launched nothing, or launched with stale arguments,
  shows the other step's values. Through ``GraphManager.run`` the same steps equal the
  step-alone oracle.
* A build that does device work outside the recorded launches (a torch op) is found
  unrecordable by the capture census, and one that allocates by the allocator's count;
  their steps keep the ordinary builds.
* The records are bounded (least recently used dropped); a rejected step leaves them usable.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.gather_world import gather_world
from helpers.mixed_steps import CONFIGS
from helpers.support import _t, host_steps, quiet
from hypothesis import given, settings

from staticattn.builders import IndexerMetadataBuilder
from staticattn.checks.view_addresses import tensors_in
from staticattn.errors import InvalidBatchError
from staticattn.graphs import GraphKind, GraphManager
from staticattn.reference import checksums

pytestmark = pytest.mark.gpu


def _write_tables(inputs, step) -> None:
    r = step.num_reqs
    inputs.block_table[:r].copy_(_t(step.block_table))
    if step.swa_block_table is not None:
        inputs.swa_block_table[:r].copy_(_t(step.swa_block_table))


def _stage(manager, q, s, slots, uniform: bool) -> None:
    """Check a step and write it into the staging, as ``run`` does before a graph or the
    graph builds read it (its uniform decode form when ``uniform``)."""
    manager.runner.stage(q, s, slots, manager.runner.check(q, s, slots), uniform)


def _views(metadata) -> list[torch.Tensor]:
    torch.cuda.synchronize()
    return [t.clone() for _, t in tensors_in(metadata)]


def _extents(gm, step) -> tuple[GraphKind, int, int, bool]:
    uniform = bool((step.query_lens == gm.config.next_n).all())
    kind = GraphKind.DECODE if uniform else GraphKind.MIXED
    return kind, step.num_reqs, step.num_tokens, uniform


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_recorded_launches_write_what_the_builds_write(name):
    cfg = CONFIGS[name](device="cuda")
    arena, inputs, builders, consumer, caches = gather_world(cfg)
    plain = GraphManager(arena, inputs, builders, consumer,
                         quiet(recorded_launches=0))
    gm = GraphManager(arena, inputs, builders, consumer, quiet())
    recorded = gm.eager.recorded_launches
    assert plain.eager.recorded_launches is None and recorded is not None
    fingerprint = arena.fingerprint()
    previous = []

    @settings(max_examples=150, deadline=None)
    @given(host_steps(cfg, max_seq_len=4096))
    def check(step):
        _write_tables(inputs, step)
        kind, k, t, uniform = _extents(gm, step)
        args = (step.query_lens, step.seq_lens, step.slot_mapping)
        _stage(plain, *args, uniform)
        expected = _views(plain.capturer.builds(kind, k, t)[1])
        if previous:  # another step's values in every view
            other = previous[-1]
            _write_tables(inputs, other)
            okind, ok, ot, ouniform = _extents(gm, other)
            _stage(plain, other.query_lens, other.seq_lens, other.slot_mapping, ouniform)
            plain.capturer.builds(okind, ok, ot)
            _write_tables(inputs, step)
        for _ in range(3):  # extents noted, then their launches recorded, then a hit
            _stage(gm, *args, uniform)
            got = _views(recorded.run(kind, k, t)[1])
            assert len(got) == len(expected)
            for a, b in zip(got, expected):
                assert torch.equal(a, b)
        res = gm.run(*args)
        assert res.mode == "eager"
        assert res.outputs.tolist() == checksums.expected(cfg, step, *caches, step.num_tokens)
        previous.append(step)

    check()
    assert arena.fingerprint() == fingerprint
    stats = recorded.stats
    assert stats.recorded > 0 and stats.hits > stats.recorded and stats.unrecordable == 0


class _SideEffectIndexer(IndexerMetadataBuilder):
    """The indexer builder with something recorded launches cannot replay in each graph
    build: a torch op ("torch op": device work that does not go through the recorded
    launches) or a scratch allocation ("allocation": an address a frozen launch could
    outlive). Counts its graph builds' Python calls: a step through recorded launches makes
    none."""

    def __init__(self, side_effect: str) -> None:
        super().__init__()
        self.side_effect, self.calls = side_effect, 0

    def bind(self, arena) -> None:
        super().bind(arena)
        self.ops = torch.zeros(1, dtype=torch.int64, device=arena.device)

    def _side(self) -> None:
        self.calls += 1
        if self.side_effect == "torch op":
            self.ops.add_(1)
        else:
            self.scratch = torch.empty(64, dtype=torch.int32, device=self.ops.device)

    def build_decode(self, batch):
        self._side()
        return super().build_decode(batch)

    def build_mixed(self, batch):
        self._side()
        return super().build_mixed(batch)


@pytest.mark.parametrize("side_effect", ["torch op", "allocation"])
def test_a_build_recorded_launches_cannot_replay_is_unrecordable(side_effect):
    cfg = CONFIGS["v3.2-n1"](device="cuda")
    arena, inputs, _, consumer, caches = gather_world(cfg)
    builder = _SideEffectIndexer(side_effect)
    builder.bind(arena)
    gm = GraphManager(arena, inputs, [builder], consumer, quiet())
    rng = np.random.default_rng(3)
    for q in ([1, 1, 1], [1, 7, 30]):
        k, t = len(q), sum(q)
        s = np.array(q) + rng.integers(0, 900, size=k)
        before = builder.calls
        for _ in range(4):  # noted, recording found it unrecordable, then plain twice
            gm.run(q, s, np.arange(t))
        # The build's Python ran on every step (once more to record): no record ran.
        assert builder.calls == before + 5
    stats = gm.eager.recorded_launches.stats
    assert stats.unrecordable == 2 and stats.hits == 0 and stats.recorded == 0


def test_recorded_launches_are_bounded_and_survive_a_rejected_step():
    cfg = CONFIGS["v4-n2"](device="cuda")
    arena, inputs, builders, consumer, caches = gather_world(cfg)
    gm = GraphManager(arena, inputs, builders, consumer,
                      quiet(recorded_launches=2))
    n = cfg.next_n
    steps = [([n] * k, [100 * (i + 1)] * k) for i, k in enumerate((1, 2, 3))]
    recorded = gm.eager.recorded_launches
    outs = []
    for q, s in steps * 3:
        outs.append(gm.run(q, s, np.arange(sum(q))).outputs.clone())
        assert len(recorded) <= 2
    for a, b in zip(outs[:6], outs[3:]):
        assert torch.equal(a, b)
    assert recorded.stats.recorded == 3
    assert "recorded launches: 2 extents kept" in gm.describe()
    with pytest.raises(InvalidBatchError):
        gm.run([n, n], [100, -5], np.arange(2 * n))
    q, s = steps[2]
    assert torch.equal(gm.run(q, s, np.arange(sum(q))).outputs, outs[2])
