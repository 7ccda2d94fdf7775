"""On the GPU: decode graphs per context bucket (``ContextGraphs``), replayed across bucket
boundaries -- lengths at and one past each edge, a request growing across a bucket between
steps, the longest request setting the bucket -- each replay equal, bit for bit through the
gather consumer, to the same step run eagerly; and the DeepGEMM indexer step in a bucket's
graph equal to the torch reference (when DeepGEMM is installed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gather_world import gather_world

from staticattn.arena import ArenaConfig
from staticattn.bench.random_batches import random_uniform_decode
from staticattn.graphs import ContextGraphs
from staticattn.kernels.dsa_libs import DEEP_GEMM, import_error

pytestmark = pytest.mark.gpu

STEPS = 2000


def _lengths(rng, k: int, contexts: list[int], n: int, step: int) -> np.ndarray:
    """Lengths of ``k`` requests: random, or at / one past a bucket edge, or request 0
    growing one token per step across the first edge."""
    kind = step % 4
    top = contexts[-1]
    if kind == 0:
        return rng.integers(n, top + 1, size=k)
    edges = np.array(contexts)
    if kind == 1:
        return np.minimum(rng.choice(edges, size=k), top)
    if kind == 2:
        return np.minimum(rng.choice(edges, size=k) + 1, top)
    s = rng.integers(n, contexts[0] // 2, size=k)  # short ones; one request sets the bucket
    s[0] = min(contexts[0] - 8 + step % 16, top)  # crosses the first edge every few steps
    return s


def test_every_replay_equals_the_eager_step_across_context_buckets():
    cfg = ArenaConfig.deepseek_v4(max_num_seqs=32, max_num_batched_tokens=256,
                                  max_model_len=16384, device="cuda")
    arena, inputs, builders, consumer, _ = gather_world(cfg)
    rng = np.random.default_rng(0)
    n = cfg.next_n
    with ContextGraphs(arena, inputs, builders, consumer, progress=False) as cg:
        cg.capture([2, 8, 32, 64])
        assert [m.context_len for m in cg.managers] == [2048, 4096, 8192, 16384]
        fingerprint = arena.fingerprint()
        served = {c: 0 for c in cg.contexts}
        mem = None
        for step in range(STEPS):
            if step == 10:  # after the eager path's first-use allocations
                torch.cuda.synchronize()
                mem = torch.cuda.memory_allocated()
            k = int(rng.integers(1, 33))
            s = random_uniform_decode(inputs, k, rng, max_seq_len=cfg.max_model_len)
            seq = _lengths(rng, k, cg.contexts, n, step).astype(np.int32)
            res = cg.run(s.query_lens, seq, s.slot_mapping)
            assert res.mode == "graph", res.reason
            got = res.outputs.clone()
            want = cg.run(s.query_lens, seq, s.slot_mapping, eager=True).outputs
            assert torch.equal(got, want), f"step {step}: lengths {seq.tolist()}"
            bucket = next(c for c in cg.contexts if c >= seq.max())
            served[bucket] += 1
            del got, want, res
        assert all(v > 0 for v in served.values()), served
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == mem  # no growth across buckets
        assert arena.fingerprint() == fingerprint
        print("replays per context bucket:", served)


@pytest.mark.skipif(bool(import_error(DEEP_GEMM)), reason=import_error(DEEP_GEMM) or "")
def test_the_indexer_step_in_a_bucket_graph_matches_the_reference():
    from dsa_reference import fill_indexer_cache, indexer_problems, new_indexer_inputs

    from staticattn.builders import make_arena
    from staticattn.builders.indexer import IndexerMetadataBuilder
    from staticattn.consumers.indexer_topk import IndexerTopKStep

    blocks = 2048
    cfg = ArenaConfig.deepseek_v4(max_model_len=65536, max_num_seqs=32,
                                  max_num_batched_tokens=64, device="cuda")
    builders = [IndexerMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    step = IndexerTopKStep(cfg, num_kv_blocks=blocks)
    keys = fill_indexer_cache(step)
    rng = np.random.default_rng(1)
    with ContextGraphs(arena, inputs, builders, step, contexts=[4096, 16384],
                       progress=False) as cg:
        cg.capture([2, 16, 64], buckets=())
        for i in range(300):
            k = int(rng.integers(1, 33))
            bound = (4096, 16384, 65536)[i % 3]
            s = random_uniform_decode(inputs, k, rng, num_kv_blocks=blocks, max_seq_len=bound)
            new_indexer_inputs(step, 2000 + i)
            res = cg.run(s.query_lens, s.seq_lens, s.slot_mapping)
            assert res.mode == "graph"
            assert indexer_problems(step, inputs, s, res.outputs, keys) == [], i
        assert cg.managers[0].stats.replays > 0 and cg.managers[1].stats.replays > 0
