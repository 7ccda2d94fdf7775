"""Graphs keyed by context bucket (``ContextGraphs``): the bucket ladder, the dispatcher's
routing of a step (through ``run`` and through the in-place ``launch``) to the smallest
bucket that holds its longest sequence, a bucket without the step's decode graph borrowing
the widest's, and every bucket computing the step right (on CPU each bucket's decode graph
is emulated by its body run eagerly; the GPU test replays captured ones)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.support import DEVICE, quiet
from helpers.toy import ToyBuilder, ToyStep, emulated_graph, toy_expected

from staticattn.arena import ArenaConfig
from staticattn.builders import make_arena
from staticattn.errors import CapacityError, GraphError
from staticattn.graphs import (
    ContextGraphs,
    EagerReason,
    GraphKind,
    default_context_buckets,
)
from staticattn.graphs.sizes import normalize_context_buckets

DECODE = GraphKind.DECODE


def _cfg(max_model_len=16384):
    return ArenaConfig.deepseek_v4(max_num_seqs=16, max_num_batched_tokens=128,
                                   max_model_len=max_model_len, device=DEVICE)


def _graphs(cfg, decode_tokens: int = 32):
    """Context graphs whose every bucket holds a decode graph of ``decode_tokens`` tokens."""
    b = ToyBuilder()
    arena, inputs = make_arena(cfg, [b])
    cg = ContextGraphs(arena, inputs, [b], ToyStep(cfg, arena.device),
                       options=quiet())
    for c in cg.contexts:
        cg.dispatcher.add(emulated_graph(cg, DECODE, decode_tokens, c))
    return cg, inputs


def _served(cg) -> list[int]:
    """Decode replays per bucket."""
    return [cg.stats.context_replays[c] for c in cg.contexts]


def test_the_default_ladder_doubles_up_to_the_context_limit():
    assert default_context_buckets(_cfg(16384)) == [2048, 4096, 8192, 16384]
    assert default_context_buckets(_cfg(1 << 20))[-3:] == [262144, 524288, 1 << 20]
    assert default_context_buckets(_cfg(1024)) == [1024]
    assert normalize_context_buckets(_cfg(), [4096, 2048, 4096]) == [2048, 4096, 16384]
    for bad in ([0], [32768]):
        with pytest.raises(GraphError, match="must be in"):
            normalize_context_buckets(_cfg(), bad)
    for bad in ([2048.5], [True]):
        with pytest.raises(GraphError, match="must be an int"):
            normalize_context_buckets(_cfg(), bad)


@pytest.mark.parametrize(("longest", "bucket"), [
    (2, 0), (2048, 0), (2049, 1), (4096, 1), (4097, 2), (8192, 2), (8193, 3), (16384, 3),
])
def test_run_sends_a_decode_step_to_the_smallest_bucket_holding_it(longest, bucket):
    cfg = _cfg()
    cg, _ = _graphs(cfg)
    n = cfg.next_n
    s = np.array([n, longest, max(n, longest // 3)])
    res = cg.run(np.full(3, n), s, np.arange(3 * n))
    assert res.mode == "graph" and res.outputs.tolist() == toy_expected(np.full(3, n), s)
    assert _served(cg) == [int(i == bucket) for i in range(4)]
    assert cg.contexts[bucket] >= longest


def test_other_steps_and_steps_past_the_decode_graphs_run_eagerly():
    cfg = _cfg()
    n = cfg.next_n
    cg, _ = _graphs(cfg, decode_tokens=2 * n)  # decode graphs of 2 requests
    res = cg.run([n, 5], [100, 100], np.arange(n + 5))  # not a uniform decode
    assert res.mode == "eager" and res.outputs.tolist() == toy_expected([n, 5], [100, 100])
    res = cg.run(np.full(3, n), [100, 100, 100], np.arange(3 * n))  # past them
    assert res.outputs.tolist() == toy_expected(np.full(3, n), [100] * 3)
    assert _served(cg) == [0, 0, 0, 0]
    assert cg.stats.eager == {EagerReason.PREFILL: 1, EagerReason.TOO_LARGE: 1}
    with pytest.raises(CapacityError):  # past max_model_len: the validation says why
        cg.run([n], [cfg.max_model_len + 1], np.arange(n))


def test_launch_routes_by_the_lengths_written_into_the_views():
    cfg = _cfg()
    cg, _ = _graphs(cfg)
    n = cfg.next_n
    for longest, bucket in ((3000, 1), (100, 0), (9000, 3)):
        views = cg.begin_step()
        views.seq_lens[:2] = [longest, n]
        views.slot_mapping[: 2 * n] = np.arange(2 * n)
        out = cg.launch(2)
        assert out[: 2 * n].tolist() == toy_expected([n, n], [longest, n])
        assert cg.stats.context_replays[cg.contexts[bucket]] == 1, (longest, _served(cg))


def test_a_bucket_without_the_steps_decode_graph_borrows_the_widest():
    """A narrow bucket holds decode graphs of 2 requests only; a step of 3 requests of
    short contexts replays the widest bucket's graph of 4 (run and launch alike)."""
    cfg = _cfg()
    n = cfg.next_n
    cg, _ = _graphs(cfg, decode_tokens=2 * n)
    cg.dispatcher.add(emulated_graph(cg, DECODE, 4 * n))  # the widest bucket only
    s = np.array([100, 200, 300])
    assert cg.run(np.full(3, n), s, np.arange(3 * n)).outputs.tolist() == toy_expected(
        np.full(3, n), s)
    views = cg.begin_step()
    views.seq_lens[:3], views.slot_mapping[: 3 * n] = s, np.arange(3 * n)
    assert cg.launch(3)[: 3 * n].tolist() == toy_expected(np.full(3, n), s)
    assert _served(cg) == [0, 0, 0, 2]
    assert cg.dispatcher.decode(3, 100) is cg.graph_for(4 * n)
    assert cg.dispatcher.decode(2, 100) is cg.graph_for(2 * n, context_len=2048)
