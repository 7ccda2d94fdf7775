"""Graph manager on any machine: capture sizes, dispatch, the eager path, misuse."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from helpers.support import quiet
from helpers.toy import ToyBuilder, ToyStep, toy_expected

from staticattn.arena import ArenaConfig
from staticattn.builders import make_arena
from staticattn.errors import GraphError, InvalidBatchError
from staticattn.graphs import (
    EagerReason,
    GraphKind,
    GraphManager,
    StepKey,
    default_capture_sizes,
    normalize_capture_sizes,
)
from staticattn.graphs.captured import RunResult

DECODE, MIXED = GraphKind.DECODE, GraphKind.MIXED

def cfg(**kw) -> ArenaConfig:
    base = dict(max_num_seqs=32, max_num_batched_tokens=256, max_model_len=4096, device="cpu")
    base.update(kw)
    return ArenaConfig.deepseek_v4(**base)


def test_default_sizes_follow_the_reference_ladder():
    c = ArenaConfig.deepseek_v4(device="cpu")  # max_num_seqs 256, next_n 2
    sizes = default_capture_sizes(c)
    assert sizes[:4] == [2, 4, 8, 16] and sizes[-1] == 512
    assert 248 in sizes and 256 in sizes and 272 in sizes and 264 not in sizes
    assert all(s % 2 == 0 for s in sizes)
    c3 = ArenaConfig.deepseek_v4(device="cpu", num_speculative_tokens=2)
    sizes3 = default_capture_sizes(c3)
    assert sizes3[:3] == [3, 6, 9] and all(s % 3 == 0 and s <= 512 for s in sizes3)
    v32 = default_capture_sizes(ArenaConfig.deepseek_v32(device="cpu"))
    assert v32[:4] == [1, 2, 4, 8] and v32[-1] == 256


@pytest.mark.parametrize("sizes, match", [([], "empty"), ([3], "multiple"), ([0], "multiple"),
                                          ([1000], "exceeds")])
def test_bad_capture_sizes(sizes, match):
    with pytest.raises(GraphError, match=match):
        normalize_capture_sizes(cfg(), sizes)


def _manager():
    c = cfg()
    b = ToyBuilder()
    arena, inputs = make_arena(c, [b])
    return GraphManager(arena, inputs, [b], ToyStep(c, arena.device), quiet())


def _fake(kind, size, num_reqs):
    """What dispatch reads of a captured graph (of the one context bucket)."""
    return SimpleNamespace(kind=kind, size=size, num_reqs=num_reqs, context_len=4096,
                           replays=0, pool_bytes=0)


def test_dispatch_picks_the_smallest_graph_that_holds_the_step():
    gm = _manager()

    def pick(num_reqs, num_tokens, shortest, longest):
        kind = DECODE if shortest == longest == 2 else MIXED
        g, reason = gm.dispatcher.route(StepKey(kind, num_tokens, num_reqs, longest))
        return (g.kind, g.size) if g is not None else reason

    assert pick(2, 4, 2, 2) is EagerReason.NOT_CAPTURED
    gm.dispatcher.add(_fake(DECODE, 8, 4), _fake(DECODE, 4, 2))
    assert pick(1, 2, 2, 2) == (DECODE, 4)
    assert pick(3, 6, 2, 2) == (DECODE, 8)
    assert pick(5, 10, 2, 2) is EagerReason.TOO_LARGE
    assert pick(2, 3, 1, 2) is EagerReason.NON_UNIFORM  # no token bucket captured
    assert pick(2, 7, 2, 5) is EagerReason.PREFILL
    gm.dispatcher.add(_fake(MIXED, 16, 16))
    gm.dispatcher.add(_fake(MIXED, 64, 32))
    assert pick(2, 3, 1, 2) == (MIXED, 16)
    assert pick(5, 10, 2, 2) == (MIXED, 16)  # a uniform decode beyond the decode graphs
    assert pick(2, 17, 2, 15) == (MIXED, 64)
    assert pick(20, 60, 1, 5) == (MIXED, 64)
    assert pick(30, 65, 1, 5) is EagerReason.TOO_LARGE
    assert gm.capture_sizes == [4, 8] and gm.buckets == [16, 64]
    assert gm.graph_for(16, MIXED).num_reqs == 16
    with pytest.raises(GraphError, match="no decode graph of 6 tokens"):
        gm.graph_for(6)


def _counts(gm, before=None) -> tuple:
    """The manager's step counts (decode replays, token-bucket replays, eager by reason),
    since ``before`` when given."""
    st = gm.stats
    now = (st.replays[DECODE], st.replays[MIXED], dict(st.eager))
    if before is None:
        return now
    eager = {r: c - before[2].get(r, 0) for r, c in now[2].items() if c != before[2].get(r, 0)}
    return now[0] - before[0], now[1] - before[1], eager


def _launchable(kind, size, num_reqs, launched):
    """A captured graph as far as run() and launch() see it; launching records its key."""
    return SimpleNamespace(kind=kind, size=size, num_reqs=num_reqs, outputs=(kind, size),
                           context_len=4096, replays=0, pool_bytes=0,
                           launch=lambda: launched.append((kind, size)),
                           outputs_for=lambda t: (kind, size),
                           result_for=lambda t: RunResult((kind, size), "graph", size, None, t,
                                                          None, kind))


def test_launch_picks_the_graph_run_picks_and_counts_the_same_reasons():
    """The in-place API and run() agree on every step: a uniform decode beyond the decode
    graphs replays a token bucket through either, and a step beyond every graph runs
    eagerly under the same reason."""
    rng = np.random.default_rng(0)
    for buckets in ({}, {16: 16, 64: 32}):
        gm = _manager()
        launched = []
        gm.dispatcher.add(_launchable(DECODE, 4, 2, launched),
                          *(_launchable(MIXED, t, r, launched) for t, r in buckets.items()))
        steps = [np.array([2, 2]), np.array([2] * 5), np.array([1, 2, 7]), np.array([2] * 20),
                 np.array([9] * 10)]
        for q in steps:
            s = q + rng.integers(0, 100, size=q.shape[0])
            slots = np.arange(int(q.sum()))
            before_run = _counts(gm)
            res = gm.run(q, s, slots)
            via_run = (res.mode, launched[-1] if res.mode == "graph" else res.reason)
            by_run = _counts(gm, before_run)
            before_launch = _counts(gm)
            views = gm.begin_step()
            views.seq_lens[: q.shape[0]] = s
            views.slot_mapping[: slots.shape[0]] = slots
            if (q == 2).all():
                before = len(launched)
                gm.launch(q.shape[0])
            else:
                views.query_start_loc[: q.shape[0] + 1] = np.concatenate(([0], np.cumsum(q)))
                before = len(launched)
                gm.launch(q.shape[0], int(q.sum()))
            if via_run[0] == "graph":
                assert len(launched) == before + 1 and launched[-1] == via_run[1], q
            else:
                assert len(launched) == before, q
            assert _counts(gm, before_launch) == by_run


def test_uniform_launch_through_a_bucket_needs_every_sequence_to_hold_its_tokens():
    gm = _manager()
    launched = []
    gm.dispatcher.add(_launchable(DECODE, 4, 2, launched),
                      _launchable(MIXED, 16, 16, launched))
    views = gm.begin_step()
    views.seq_lens[:5] = [9, 9, 1, 9, 9]  # request 2 schedules 2 tokens of a 1-token sequence
    views.slot_mapping[:10] = np.arange(10)
    host_before = views.query_start_loc.copy(), views.counts.copy()
    with pytest.raises(InvalidBatchError, match="more than its sequence"):
        gm.launch(5)
    assert launched == []
    assert (views.query_start_loc == host_before[0]).all()
    assert (views.counts == host_before[1]).all()
    views.seq_lens[2] = 2
    gm.launch(5)
    assert launched == [(MIXED, 16)] and gm.stats.replays == {MIXED: 1}


def test_eager_run_on_cpu_counts_fallbacks_and_matches_the_step():
    gm = _manager()
    rng = np.random.default_rng(0)
    for _ in range(20):
        q = np.sort(rng.integers(1, 4, size=int(rng.integers(1, 10))))
        s = q + rng.integers(0, 100, size=q.shape[0])
        res = gm.run(q, s, np.zeros(int(q.sum()), dtype=np.int64))
        assert res.mode == "eager"
        assert res.outputs.tolist() == toy_expected(q, s)
    assert gm.stats.replays_total == 0 and gm.stats.eager_total == 20


def test_capture_needs_cuda_and_closed_manager_refuses():
    gm = _manager()
    with pytest.raises(GraphError, match="CUDA"):
        gm.capture([2])
    gm.close()
    with pytest.raises(GraphError, match="closed"):
        gm.run([2], [5], [0, 1])
