"""On one GPU: each DCP rank's DeepSeek V4.1 graph-safe builds -- both indexers and the
compressed builder, decode and mixed -- captured in a CUDA graph with the input staging,
replayed over random steps (captured short, replayed long), equal to the per-rank oracle
(``staticattn/reference/v41_dcp.py``) every time, without allocating. The ranks' arenas share
the GPU: the localisation needs no collective, only the rank's static int (the ranks under
NCCL: ``tests/distributed/test_dcp_demo.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.cuda_capture import capture
from helpers.dcp_workers import random_step
from helpers.v41_steps import SMALL, group_tables, make_v41_step

from staticattn.arena import ArenaConfig
from staticattn.builders import Batch, default_builders, make_arena
from staticattn.builders.indexer.prefill import max_chunks
from staticattn.reference import dcp_indexer
from staticattn.reference import v41_compressed as single
from staticattn.reference import v41_dcp as oracle
from staticattn.reference.v41_compressed import V41Step

pytestmark = pytest.mark.gpu

S = 8  # requests of the captured decode step
BUCKET = (16, 256)  # requests, tokens of the captured mixed step
CASES = [(2, 2, 64, 1), (4, 4, 128, 3)]  # world, interleave, block size, draft tokens
INDEX_TYPES = ("c1a", "c2a")


def _setup(world, rank, interleave, block_size, spec, backend):
    cfg = ArenaConfig.preset(
        "deepseek-v4.1-flash", **SMALL, block_size=block_size, num_speculative_tokens=spec,
        dcp_world_size=world, dcp_rank=rank, cp_kv_cache_interleave_size=interleave,
        device="cuda", kernel_backend=backend)
    builders = default_builders(cfg)
    arena, inputs = make_arena(cfg, builders)
    return cfg, builders, arena, inputs


def _write(inputs, v41: V41Step, padded: int) -> None:
    """The step's tables (padded requests' rows the null block) and host inputs, staged
    without the copy the graph holds."""
    step, r = v41.step, v41.step.num_reqs
    for name, table in v41.tables.items():
        inputs.block_tables[name][:r].copy_(torch.from_numpy(table))
        inputs.block_tables[name][r:padded].zero_()
    inputs.swa_block_table[:r].copy_(torch.from_numpy(step.swa_block_table))
    inputs.stage(step.query_lens, step.seq_lens, step.slot_mapping,
                 num_reqs_padded=step.num_reqs_padded, num_tokens_padded=step.num_tokens_padded)


def _decode_step(cfg, rng, k, short=False) -> V41Step:
    n = cfg.next_n
    lens = np.full(k, n) if short else rng.integers(n, cfg.max_model_len + 1, size=k)
    return make_v41_step(cfg, [n] * k, lens, num_reqs_padded=S, num_tokens_padded=S * n,
                         rng=rng)


def _check(cfg, rank, metas, v41, num_reqs, num_tokens, arena, mixed_rows=None):
    for t in INDEX_TYPES:
        view, view_step = single.type_view(cfg, v41, t)
        meta = metas[f"indexer.{t}"]
        if mixed_rows is None:
            want = oracle.indexer_metadata(cfg, v41, t, rank, graph=True)
            dcp_indexer.assert_matches(meta, want, view_step, arena)
        else:
            rows = max_chunks(cfg, num_reqs, num_tokens, single.RATIOS[t])
            want = oracle.mixed_indexer(cfg, v41, t, rank, num_reqs, num_tokens, rows)
            dcp_indexer.assert_mixed_matches(meta, want, view, view_step)
    want = oracle.compressed(cfg, v41, rank, num_reqs, num_tokens)
    for name, fields in want.items():
        for field, values in fields.items():
            assert getattr(metas["compressed"].types[name], field).tolist() == values


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize(("world", "interleave", "block_size", "spec"), CASES)
def test_decode_replay_matches_oracle_on_every_rank(backend, world, interleave, block_size,
                                                     spec):
    for rank in range(world):
        cfg, builders, arena, inputs = _setup(world, rank, interleave, block_size, spec,
                                              backend)
        rng = np.random.default_rng(rank)
        _write(inputs, _decode_step(cfg, rng, S, short=True), S)
        batch = Batch.for_decode_capture(inputs, S)

        def body(inputs=inputs, builders=builders, batch=batch, n=cfg.next_n):
            inputs.copy_to_device(S, S * n)
            return {b.name: b.build_decode(batch) for b in builders}

        graph, metas = capture(body)
        before = arena.fingerprint()
        for _ in range(100):
            v41 = _decode_step(cfg, rng, int(rng.integers(1, S + 1)))
            _write(inputs, v41, S)
            graph.replay()
            torch.cuda.synchronize()
            _check(cfg, rank, metas, v41, S, S * cfg.next_n, arena)
        assert arena.fingerprint() == before


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize(("world", "interleave", "block_size", "spec"), CASES)
def test_mixed_replay_matches_oracle_on_every_rank(backend, world, interleave, block_size,
                                                    spec):
    num_reqs, num_tokens = BUCKET
    for rank in range(world):
        cfg, builders, arena, inputs = _setup(world, rank, interleave, block_size, spec,
                                              backend)
        rng = np.random.default_rng(rank)
        _write(inputs, make_v41_step(cfg, [1], [1], rng=rng), 1)
        inputs.copy_to_device(num_reqs, num_tokens)
        batch = Batch.for_mixed_capture(inputs, num_reqs, num_tokens)

        def body(inputs=inputs, builders=builders, batch=batch):
            inputs.copy_to_device(num_reqs, num_tokens)
            return {b.name: b.build_mixed(batch) for b in builders}

        graph, metas = capture(body)
        for _ in range(50):
            step = random_step(cfg, rng)
            v41 = V41Step(step, group_tables(cfg, step.num_reqs, rng))
            _write(inputs, v41, step.num_reqs)
            graph.replay()
            torch.cuda.synchronize()
            _check(cfg, rank, metas, v41, num_reqs, num_tokens, arena, mixed_rows=True)
