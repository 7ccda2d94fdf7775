"""On one GPU: each DCP rank's graph-safe indexer builds (decode and mixed) captured in a CUDA
graph with the input staging, replayed over random steps (captured short, replayed long),
equal to the per-rank oracle every time, without allocating. The ranks' arenas share the GPU
here: the localisation needs no collective, only the rank's static int."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.cuda_capture import capture
from helpers.dcp_workers import random_step
from helpers.mixed_steps import stage_mixed
from helpers.support import index_ratio_fields, make_step

from staticattn.arena import ArenaConfig
from staticattn.builders import Batch, make_arena
from staticattn.builders.indexer.builder import IndexerMetadataBuilder
from staticattn.builders.indexer.prefill import max_chunks
from staticattn.reference import dcp_indexer as oracle

pytestmark = pytest.mark.gpu

S = 8  # requests of the captured decode step
BUCKET = (16, 256)  # requests, tokens of the captured mixed step
CASES = [(2, 1, 1, 64, 1), (2, 4, 4, 256, 2), (4, 4, 8, 256, 4)]  # world, R, I, bs, next_n


def _setup(world, rank, ratio, interleave, block_size, n, backend):
    cfg = ArenaConfig(
        max_num_seqs=16, max_num_batched_tokens=256, max_model_len=8192,
        block_size=block_size, num_speculative_tokens=n - 1, **index_ratio_fields(ratio),
        max_prefill_workspace=3000, max_logits_bytes=4 * 50_000, dcp_world_size=world,
        dcp_rank=rank, cp_kv_cache_interleave_size=interleave, device="cuda",
        kernel_backend=backend,
    )
    builder = IndexerMetadataBuilder()
    arena, inputs = make_arena(cfg, [builder])
    return cfg, builder, arena, inputs


def _decode_step(cfg, rng, k, short=False):
    n = cfg.next_n
    lens = np.full(k, n) if short else rng.integers(n, cfg.max_model_len + 1, size=k)
    return make_step(cfg, [n] * k, lens, num_reqs_padded=S, num_tokens_padded=S * n, rng=rng)


def _stage(inputs, step):
    r = step.num_reqs
    inputs.block_table[:r].copy_(torch.from_numpy(step.block_table))
    inputs.block_table[r:step.num_reqs_padded].zero_()
    inputs.stage(step.query_lens, step.seq_lens, step.slot_mapping,
                 num_reqs_padded=step.num_reqs_padded,
                 num_tokens_padded=step.num_tokens_padded)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize(("world", "ratio", "interleave", "block_size", "n"), CASES)
def test_decode_replay_matches_oracle_on_every_rank(backend, world, ratio, interleave,
                                                     block_size, n):
    for rank in range(world):
        cfg, builder, arena, inputs = _setup(world, rank, ratio, interleave, block_size, n,
                                             backend)
        rng = np.random.default_rng(rank)
        _stage(inputs, _decode_step(cfg, rng, S, short=True))
        batch = Batch.for_decode_capture(inputs, S)

        def body(inputs=inputs, builder=builder, batch=batch, n=cfg.next_n):
            inputs.copy_to_device(S, S * n)
            return builder.build_decode(batch)

        graph, meta = capture(body)
        before = arena.fingerprint()
        for _ in range(200):
            step = _decode_step(cfg, rng, int(rng.integers(1, S + 1)))
            _stage(inputs, step)
            graph.replay()
            torch.cuda.synchronize()
            want = oracle.indexer_metadata(cfg, step, rank, graph=True)
            oracle.assert_matches(meta, want, step, arena)
        assert arena.fingerprint() == before


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize(("world", "ratio", "interleave", "block_size", "n"), CASES)
def test_mixed_replay_matches_oracle_on_every_rank(backend, world, ratio, interleave,
                                                    block_size, n):
    num_reqs, num_tokens = BUCKET
    for rank in range(world):
        cfg, builder, arena, inputs = _setup(world, rank, ratio, interleave, block_size, n,
                                             backend)
        rng = np.random.default_rng(rank)
        first = make_step(cfg, [1], [1], rng=rng)
        stage_mixed(inputs, first, num_reqs, num_tokens)
        batch = Batch.for_mixed_capture(inputs, num_reqs, num_tokens)

        def body(inputs=inputs, builder=builder, batch=batch):
            inputs.copy_to_device(num_reqs, num_tokens)
            return builder.build_mixed(batch)

        graph, meta = capture(body)
        rows = max_chunks(cfg, num_reqs, num_tokens)
        for _ in range(100):
            step = random_step(cfg, rng)
            r = step.num_reqs
            inputs.block_table[:r].copy_(torch.from_numpy(step.block_table))
            inputs.stage(step.query_lens, step.seq_lens, step.slot_mapping)
            graph.replay()
            torch.cuda.synchronize()
            want = oracle.mixed_indexer(cfg, step, rank, num_reqs, num_tokens, rows)
            oracle.assert_mixed_matches(meta, want, cfg, step)
