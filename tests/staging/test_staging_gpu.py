"""On the GPU: a captured graph stages inputs and reads arena views, replayed with changing
host inputs; the host never overwrites staging an in-flight replay still has to read."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.staging_graph import S, staged_sums

from staticattn.arena import ArenaConfig
from staticattn.builders import make_arena
from staticattn.graphs.python_gc import gc_paused

pytestmark = pytest.mark.gpu



def _capture(inputs, consumer_out):
    """Graph = staging kernel + a consumer reading the arena views (sum of positions and
    seq lens per token's request) into ``consumer_out``."""
    n = inputs.config.next_n
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())

    def body():
        inputs.copy_to_device(S, S * n)
        t2r = inputs.token_to_req[: S * n].long()
        torch.add(inputs.positions[: S * n], inputs.seq_lens[:S][t2r], out=consumer_out)

    with torch.cuda.stream(stream):
        body()  # warm-up: compiles the staging kernel outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with gc_paused(), torch.cuda.graph(graph):
        body()
    return graph


def test_replay_1000_steps_with_changing_host_inputs():
    cfg = ArenaConfig.deepseek_v4(max_model_len=65536, max_num_seqs=64, max_num_batched_tokens=512)
    arena, inputs = make_arena(cfg)
    n = cfg.next_n
    out = torch.zeros(S * n, dtype=torch.int64, device="cuda")
    graph = _capture(inputs, out)
    before = arena.fingerprint()
    rng = np.random.default_rng(0)
    torch.cuda.synchronize()
    stats0 = torch.cuda.memory_stats()
    wrong = 0
    for _ in range(1000):
        k = int(rng.integers(1, S + 1))
        q = np.full(k, n)
        L = rng.integers(n, cfg.max_model_len, size=k)
        inputs.stage(q, L, np.arange(k * n), num_reqs_padded=S, num_tokens_padded=S * n)
        graph.replay()
        got = out.tolist()  # synchronises
        wrong += got != staged_sums(q.tolist(), L.tolist(), n)
    stats1 = torch.cuda.memory_stats()
    assert wrong == 0
    assert arena.fingerprint() == before
    assert stats1["allocation.all.allocated"] == stats0["allocation.all.allocated"]
    assert stats1["allocated_bytes.all.allocated"] == stats0["allocated_bytes.all.allocated"]


@pytest.mark.parametrize("guarded", [True, False])
def test_staging_is_not_overwritten_while_a_replay_may_read_it(guarded):
    """Queue a long kernel, then stage+replay step A and immediately stage step B. With the
    event guard the host waits for A's staging read; without it (the negative control) the
    host overwrites A's inputs before the GPU reads them."""
    cfg = ArenaConfig.deepseek_v4(max_model_len=65536, max_num_seqs=64, max_num_batched_tokens=512)
    _, inputs = make_arena(cfg)
    n = cfg.next_n
    out = torch.zeros(S * n, dtype=torch.int64, device="cuda")
    graph = _capture(inputs, out)
    graph.staging_event = inputs._consumed  # the graph records it either way: keep it alive
    if not guarded:
        inputs._consumed = None
    qa, la = np.full(S, n), np.full(S, 1000)
    qb, lb = np.full(S, n), np.full(S, 5000)
    # Without the guard, step B must be staged while replay A is still held back; a host
    # starved by other work may miss the window, so each attempt checks it did not and the
    # next one holds twice as long.
    for cycles in (200_000_000, 400_000_000, 800_000_000):  # ~0.1, 0.2, 0.4 s of GPU time
        torch.cuda.synchronize()
        torch.cuda._sleep(cycles)  # queued ahead of replay A
        held = torch.cuda.Event()
        held.record()
        inputs.stage(qa, la, np.arange(S * n), num_reqs_padded=S, num_tokens_padded=S * n)
        graph.replay()
        result_a = out.clone()
        inputs.stage(qb, lb, np.arange(S * n), num_reqs_padded=S, num_tokens_padded=S * n)
        in_window = not held.query()
        graph.replay()
        result_b = out.clone()
        torch.cuda.synchronize()
        if guarded or in_window:
            break
    assert result_b.tolist() == staged_sums(qb.tolist(), lb.tolist(), n)
    if guarded:
        assert result_a.tolist() == staged_sums(qa.tolist(), la.tolist(), n)
    else:
        assert in_window, "the host never staged step B while replay A was held back"
        assert result_a.tolist() == staged_sums(qb.tolist(), lb.tolist(), n), (
            "negative control: without the guard step A should have read step B's inputs"
        )
