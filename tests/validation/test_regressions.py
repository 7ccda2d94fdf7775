"""Regression cases from failures users hit in other engines (spec vllm-0.33-delta.md §3).

* DeepGEMM's paged-MQA schedule reads out of bounds on all-zero lengths at batch sizes that
  are multiples of 32 (vLLM #51970, DeepGEMM #353): ours is defined there, on both backends;
* graph padding rows publishing cache indices an eager consumer later reads (vLLM #56771,
  #55177): no padded row of any output holds an index >= 0;
* the first long-context decode after capture at short lengths (SGLang #34718): graphs
  captured at minimal lengths replay at 128K and at ``max_model_len`` equal to eager;
* a decode step right after an eager prefill of a long prompt.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.support import DEVICE, quiet

from staticattn.arena import ArenaConfig
from staticattn.bench.random_batches import fixed_step
from staticattn.builders import IndexerMetadataBuilder, SparseSWAMetadataBuilder, make_arena
from staticattn.checks import same_outputs, snapshot_outputs
from staticattn.consumers import GatherConsumer
from staticattn.graphs import EagerBuild, GraphKind, GraphManager
from staticattn.kernels.indexer.mqa_schedule import paged_mqa_schedule
from staticattn.reference import indexer as oracle


@pytest.mark.parametrize("next_n", [1, 2])
def test_all_zero_lengths_at_every_multiple_of_32(backend, next_n):
    for batch in range(32, 257, 32):
        lens = torch.zeros(batch, next_n, dtype=torch.int32, device=DEVICE)
        out = torch.full((133, 2), -5, dtype=torch.int32, device=DEVICE)
        paged_mqa_schedule(backend, lens, out)
        assert out.tolist() == oracle.mqa_schedule(lens.tolist(), 132, legacy=False), batch


def _world(**overrides):
    cfg = ArenaConfig.deepseek_v4(**overrides)
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    gm = GraphManager(arena, inputs, builders, GatherConsumer(cfg, num_kv_blocks=1 << 16),
                      quiet())
    return cfg, inputs, gm


def _padded_rows_hold_no_index(g, num_tokens: int, num_decode_tokens: int) -> None:
    swa, idx = g.metadata["swa"], g.metadata["indexer"]
    rows = swa.decode_swa_indices.shape[0]
    for name, view in (("swa", swa.decode_swa_indices), ("dense", swa.dense_decode_indices)):
        assert (view[num_decode_tokens:rows] < 0).all(), f"{name} padded decode rows"
    assert (swa.decode_swa_lens[num_decode_tokens:] == 0).all()
    assert (idx.slot_mapping[num_tokens:] < 0).all(), "compressed slots of padded tokens"
    assert (swa.slot_mapping[num_tokens:] < 0).all(), "slots of padded tokens"
    chunks = swa.dense_prefill
    for c in range(chunks.num_chunks if chunks is not None else 0):
        rows, _ = chunks.write(c)
        live = max(num_tokens - num_decode_tokens - chunks.first_row(c), 0)
        assert (rows[live:] < 0).all(), f"padded dense prefill rows of chunk {c}"


@pytest.mark.gpu
def test_padded_rows_never_hold_a_cache_index():
    cfg, inputs, gm = _world(max_model_len=65536)
    rng = np.random.default_rng(0)
    with gm:
        gm.capture([8, 64], buckets=[512])
        n = cfg.next_n
        decode = fixed_step(inputs, np.full(3, n), rng.integers(5000, 60000, 3), rng)
        res = gm.run(decode.query_lens, decode.seq_lens, decode.slot_mapping)
        torch.cuda.synchronize()
        assert res.graph_kind is GraphKind.DECODE and res.graph_size == 8
        _padded_rows_hold_no_index(gm.graph_for(8), 3 * n, 3 * n)
        mixed = fixed_step(inputs, np.array([n, 1, 300]), np.array([9000, 40000, 300]), rng)
        res = gm.run(mixed.query_lens, mixed.seq_lens, mixed.slot_mapping)
        torch.cuda.synchronize()
        assert res.graph_kind is GraphKind.MIXED
        _padded_rows_hold_no_index(gm.graph_for(512, GraphKind.MIXED), n + 301, n + 1)


@pytest.mark.gpu
def test_capture_short_then_replay_at_128k_and_max_model_len():
    cfg, inputs, gm = _world()  # 1M context
    rng = np.random.default_rng(1)
    n = cfg.next_n
    with gm:
        gm.capture([2, 8], buckets=[64])
        for lens in ([131_072], [131_072, 700_000, cfg.max_model_len],
                     [cfg.max_model_len] * 4):
            step = fixed_step(inputs, np.full(len(lens), n), np.array(lens), rng)
            res = gm.run(step.query_lens, step.seq_lens, step.slot_mapping)
            assert res.mode == "graph"
            eager = gm.run(step.query_lens, step.seq_lens, step.slot_mapping,
                           eager=EagerBuild.REFERENCE)
            assert same_outputs(snapshot_outputs(res.outputs), snapshot_outputs(eager.outputs))
        mixed = fixed_step(inputs, np.array([n, 1, 40]),
                           np.array([cfg.max_model_len, 131_072, 200_040]), rng)
        res = gm.run(mixed.query_lens, mixed.seq_lens, mixed.slot_mapping)
        assert res.graph_kind is GraphKind.MIXED
        eager = gm.run(mixed.query_lens, mixed.seq_lens, mixed.slot_mapping,
                       eager=EagerBuild.REFERENCE)
        assert same_outputs(snapshot_outputs(res.outputs), snapshot_outputs(eager.outputs))


@pytest.mark.gpu
def test_decode_after_an_eager_prefill_of_a_long_prompt():
    cfg, inputs, gm = _world(max_model_len=262_144, max_num_batched_tokens=8192)
    rng = np.random.default_rng(2)
    n = cfg.next_n
    with gm:
        gm.capture([2, 8], buckets=[16])  # the 8,000-token prefill fits no bucket: eager
        prompt = fixed_step(inputs, np.array([8000]), np.array([200_000]), rng)
        res = gm.run(prompt.query_lens, prompt.seq_lens, prompt.slot_mapping)
        assert res.mode == "eager"
        step = fixed_step(inputs, np.full(2, n), np.array([200_000 + n, 17]), rng)
        res = gm.run(step.query_lens, step.seq_lens, step.slot_mapping)
        assert res.mode == "graph"
        eager = gm.run(step.query_lens, step.seq_lens, step.slot_mapping,
                       eager=EagerBuild.REFERENCE)
        assert same_outputs(snapshot_outputs(res.outputs), snapshot_outputs(eager.outputs))
