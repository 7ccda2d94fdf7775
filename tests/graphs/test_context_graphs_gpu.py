"""On the GPU: decode graphs per context bucket (``ContextGraphs``), replayed across bucket
boundaries -- lengths at and one past each edge, a request growing across a bucket between
steps, the longest request setting the bucket -- each replay equal, bit for bit through the
gather consumer, to the same step run eagerly and to the step-alone oracle
(``oracle.checksums``: what every token must read, from the lengths and block tables
alone); and the DeepGEMM indexer step in a bucket's graph equal to the torch reference (when
DeepGEMM is installed)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers.gather_world import gather_world
from helpers.support import quiet

from staticattn.arena import ArenaConfig
from staticattn.bench.random_batches import random_uniform_decode, write_block_rows
from staticattn.graphs import ContextGraphs, EagerBuild
from staticattn.kernels.runtime.dsa_libs import DEEP_GEMM, import_error
from staticattn.reference import checksums

pytestmark = pytest.mark.gpu

STEPS = 2000
QUIET = quiet()


def _served(cg) -> list[int]:
    """Decode replays per context bucket."""
    return [cg.stats.context_replays[c] for c in cg.contexts]


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


class _BoundStep:
    """Writes the ``max_seq_len`` its batch was built with into every row: in a graph, the
    bound it was captured for (the bucket that served the step)."""

    def __init__(self, cfg):
        self.out = torch.zeros(cfg.max_num_batched_tokens, dtype=torch.int64, device="cuda")

    def __call__(self, batch, md):
        self.out[: batch.num_actual_tokens].fill_(batch.max_seq_len)
        return self.out[: batch.num_actual_tokens]


def _cfg():
    return ArenaConfig.deepseek_v4(max_num_seqs=32, max_num_batched_tokens=256,
                                   max_model_len=16384, device="cuda")


def test_each_step_replays_the_graph_of_its_bucket():
    from staticattn.builders import IndexerMetadataBuilder, make_arena

    cfg = _cfg()
    builders = [IndexerMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    rng = np.random.default_rng(2)
    n = cfg.next_n
    with ContextGraphs(arena, inputs, builders, _BoundStep(cfg), options=QUIET) as cg:
        cg.capture([2, 8, 32, 64], buckets=())
        for step in range(400):
            k = int(rng.integers(1, 33))
            s = random_uniform_decode(inputs, k, rng)
            seq = _lengths(rng, k, cg.contexts, n, step).astype(np.int32)
            if step % 2:  # the in-place path
                views = cg.begin_step()
                views.seq_lens[:k], views.slot_mapping[: k * n] = seq, s.slot_mapping
                bound = cg.launch(k)[0].item()
            else:
                bound = cg.run(s.query_lens, seq, s.slot_mapping).outputs[0].item()
            assert bound == next(c for c in cg.contexts if c >= seq.max()), seq.tolist()
        assert all(_served(cg)), _served(cg)


def test_every_replay_equals_the_eager_step_across_context_buckets():
    cfg = _cfg()
    arena, inputs, builders, consumer, caches = gather_world(cfg)
    rng = np.random.default_rng(0)
    n = cfg.next_n
    with ContextGraphs(arena, inputs, builders, consumer, options=QUIET) as cg:
        cg.capture([2, 8, 32, 64])
        assert cg.contexts == [2048, 4096, 8192, 16384]
        fingerprint = arena.fingerprint()
        for k in range(1, 33):  # every extent once, both paths, before the baseline
            s = random_uniform_decode(inputs, k, rng)
            cg.run(s.query_lens, s.seq_lens, s.slot_mapping)
            cg.run(s.query_lens, s.seq_lens, s.slot_mapping, eager=EagerBuild.REFERENCE)
        torch.cuda.synchronize()
        mem = torch.cuda.memory_allocated()
        for step in range(STEPS):
            k = int(rng.integers(1, 33))
            s = random_uniform_decode(inputs, k, rng, max_seq_len=cfg.max_model_len)
            seq = _lengths(rng, k, cg.contexts, n, step).astype(np.int32)
            # The block rows these lengths read (the oracle reads them from the host).
            main, swa = write_block_rows(inputs, seq, rng, 4096)
            res = cg.run(s.query_lens, seq, s.slot_mapping)
            assert res.mode == "graph", res.reason
            got = res.outputs.clone()
            want = cg.run(s.query_lens, seq, s.slot_mapping, eager=EagerBuild.REFERENCE).outputs
            assert torch.equal(got, want), f"step {step}: lengths {seq.tolist()}"
            alone = SimpleNamespace(query_lens=s.query_lens, seq_lens=seq,
                                    slot_mapping=s.slot_mapping, block_table=main,
                                    swa_block_table=swa)
            assert got.tolist() == checksums.expected(cfg, alone, *caches, k * n), (
                f"step {step}: lengths {seq.tolist()}")
            del got, want, res
        assert all(_served(cg)), _served(cg)
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == mem  # no growth across buckets
        assert arena.fingerprint() == fingerprint


def test_ten_thousand_steps_across_buckets_grow_no_memory():
    """A soak: 10^4 replays moving between the buckets (half through the in-place views),
    with the pool of every bucket reported and the device's memory, allocated and
    reserved, the same at the end as after the first pass."""
    cfg = _cfg()
    arena, inputs, builders, consumer, _ = gather_world(cfg)
    rng = np.random.default_rng(3)
    n = cfg.next_n
    with ContextGraphs(arena, inputs, builders, consumer, options=QUIET) as cg:
        cg.capture([2, 8, 32, 64], buckets=())
        # One pool for every bucket (empty here: the gather consumer and the builds write
        # only their own buffers and the arena).
        assert cg.pool_bytes == cg.pool.held_bytes()
        assert f"pool {cg.pool_bytes / 2**20:.2f} MiB" in cg.describe()
        fingerprint = arena.fingerprint()
        s = random_uniform_decode(inputs, 32, rng, max_seq_len=cfg.max_model_len)
        for step in range(10_000 + 32):
            if step == 32:  # every extent has run once: the baseline
                torch.cuda.synchronize()
                allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
            k = 1 + step % 32
            seq = _lengths(rng, k, cg.contexts, n, step).astype(np.int32)
            if step % 2:
                views = cg.begin_step()
                views.seq_lens[:k], views.slot_mapping[: k * n] = seq, s.slot_mapping[: k * n]
                cg.launch(k)
            else:
                assert cg.run(s.query_lens[:k], seq, s.slot_mapping[: k * n]).mode == "graph"
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == allocated
        assert torch.cuda.memory_reserved() == reserved
        assert arena.fingerprint() == fingerprint
        served = _served(cg)
        assert sum(served) == 10_000 + 32 and min(served) > 100, served  # every bucket served


@pytest.mark.skipif(bool(import_error(DEEP_GEMM)), reason=import_error(DEEP_GEMM) or "")
def test_the_indexer_step_in_a_bucket_graph_matches_the_reference():
    from helpers.dsa_reference import fill_indexer_cache, indexer_problems, new_indexer_inputs

    from staticattn.builders import make_arena
    from staticattn.builders.indexer.builder import IndexerMetadataBuilder
    from staticattn.consumers.real.indexer_topk import IndexerTopKStep

    blocks = 2048
    cfg = ArenaConfig.deepseek_v4(max_model_len=65536, max_num_seqs=32,
                                  max_num_batched_tokens=64, device="cuda")
    builders = [IndexerMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    step = IndexerTopKStep(cfg, num_kv_blocks=blocks)
    keys = fill_indexer_cache(step)
    rng = np.random.default_rng(1)
    with ContextGraphs(arena, inputs, builders, step, contexts=[4096, 16384],
                       options=QUIET) as cg:
        cg.capture([2, 16, 64], buckets=())
        edges = np.array([4096, 4097, 16384, 16385, 65536])
        for i in range(300):
            k = int(rng.integers(1, 33))
            bound = (4096, 16384, 65536)[i % 3]
            s = random_uniform_decode(inputs, k, rng, num_kv_blocks=blocks, max_seq_len=bound)
            if i % 4 == 3:  # lengths at and one past the bucket edges (block rows written
                s = random_uniform_decode(  # for the longest: 65536)
                    inputs, k, rng, num_kv_blocks=blocks, max_seq_len=65536, short_fraction=0)
                s.seq_lens[:] = rng.choice(edges, size=k)
            new_indexer_inputs(step, 2000 + i)
            res = cg.run(s.query_lens, s.seq_lens, s.slot_mapping)
            assert res.mode == "graph"
            assert indexer_problems(step, inputs, s, res.outputs, keys) == [], i
        first, second = _served(cg)[:2]
        assert first > 0 and second > 0
