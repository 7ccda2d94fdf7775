"""A layer type the package does not ship, added through the tables alone.

Two rows are added to :data:`staticattn.model.LAYER_TYPES` (and to DeepSeek V4's encoding in
:data:`staticattn.model.ARCHITECTURES`), nothing else: ``c8a``, a top-k type with an 8x
compressed cache and its own index cache, and ``c64a``, a type that reads every entry of a
64x compressed cache. A model made of them gets its arena buffers sized from the rows, and
both builders' compressed slots, lengths and rows -- eager, graph-safe decode and mixed
builds, both kernel backends -- agree with the oracles, which take ``R`` from the config's
layer types and the formulas from the spec. Beside ``c4a``, as a second top-k type, ``c8a``
also runs through the real consumer (DeepGEMM and FlashMLA emulated on CPU): its own indexer,
its top-k turned into its compressed slots, its layers' attention, every output against
torch references."""

from __future__ import annotations

from types import MappingProxyType

import numpy as np
import pytest
from helpers.decode_steps import fill_caches, new_inputs, step_problems
from helpers.dsa_reference import emulated_flash_mla, emulated_paged_mqa_logits
from helpers.mixed_steps import bucket_for, check_mixed
from helpers.support import DEVICE, host_steps, make_step, stage
from hypothesis import given, settings

from staticattn.arena import ArenaConfig
from staticattn.bench.random_batches import random_uniform_decode
from staticattn.builders import (
    Batch,
    IndexerMetadataBuilder,
    SparseSWAMetadataBuilder,
    default_builders,
    make_arena,
)
from staticattn.consumers.real.sparse_decode import SparseDecodeStep
from staticattn.model import ARCHITECTURES, LAYER_TYPES, Cache, LayerType, Reads, presets
from staticattn.reference import indexer as indexer_oracle
from staticattn.reference.swa import assert_matches as assert_swa_matches
from staticattn.reference.swa import expected_for_step

C8A = LayerType("c8a", 8, True, Reads.TOPK,
                frozenset({Cache.COMPRESSED_KV, Cache.INDEX_K, Cache.COMPRESSOR_STATE}), True)
C64A = LayerType("c64a", 64, True, Reads.ALL,
                 frozenset({Cache.COMPRESSED_KV, Cache.COMPRESSOR_STATE}), False)


@pytest.fixture
def extended_table(monkeypatch):
    """The two rows in the table and in DeepSeek V4's encoding (ratios 8 and 64)."""
    monkeypatch.setitem(LAYER_TYPES, "c8a", C8A)
    monkeypatch.setitem(LAYER_TYPES, "c64a", C64A)
    v4 = ARCHITECTURES["deepseek_v4"]
    encoding = MappingProxyType({**v4.encoding, 8: "c8a", 64: "c64a"})
    monkeypatch.setattr(presets, "ARCHITECTURES", MappingProxyType(
        {**ARCHITECTURES, "deepseek_v4": type(v4)(v4.name, encoding)}))


def _config(backend: str) -> ArenaConfig:
    return ArenaConfig(
        architecture="deepseek_v4", compress_ratios=(1, 8, 64, 8, 1), sliding_window=16,
        swa_block_size=16, block_size=256, num_speculative_tokens=1, max_num_seqs=16,
        max_num_batched_tokens=256, max_model_len=4096, max_prefill_workspace=3000,
        max_logits_bytes=200_000, index_topk=64, num_sms=8, device=DEVICE,
        kernel_backend=backend,
    )


def world(backend: str):
    cfg = _config(backend)
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    return cfg, builders, arena, inputs


def test_the_arena_is_sized_from_the_rows(extended_table):
    cfg, builders, arena, _ = world("torch")
    assert [t.name for t in cfg.layer_types] == ["swaonly", "c8a", "c64a"]
    assert (cfg.index_compress_ratio, cfg.storage_block_size) == (8, 32)
    assert cfg.dense_layer_type is C64A and cfg.dense_width == 128  # round_up(4096 / 64, 128)
    assert cfg.dcp_sharded_ratios == (8,)
    assert arena["indexer.compressed_slot_mapping"].shape == (256,)
    assert arena["swa.dense_decode_indices"].shape == (cfg.max_decode_tokens, 1, 128)
    assert arena["swa.dense_prefill_indices"].shape == (256, 128)
    assert builders[1].layer_types == ("swaonly", "c8a", "c64a")


def test_compressed_slots_and_lengths_follow_the_ratio(extended_table, backend):
    """One prefill of 40 tokens at positions 240..279, block row [5, 7]: the tokens at
    p = 247, 255, 263, 271, 279 complete entries 30..34 (32 per block); a decode token at
    p = 299 sees (299 + 1) // 8 = 37 entries and (299 + 1) // 64 = 4 dense ones."""
    cfg, (indexer, swa), arena, inputs = world(backend)
    step = make_step(cfg, [2, 40], [300, 280], rng=np.random.default_rng(0))
    step.block_table[1, :2] = [5, 7]
    batch = stage(inputs, step)
    meta = indexer.build(batch)
    slots = meta.slot_mapping[2:42].tolist()
    assert [s for s in slots if s >= 0] == [5 * 32 + 30, 5 * 32 + 31, 7 * 32, 7 * 32 + 1,
                                           7 * 32 + 2]
    assert meta.decode.seq_lens.flatten().tolist()[:2] == [299 // 8, 300 // 8]
    indexer_oracle.assert_matches(meta, indexer_oracle.indexer_metadata(cfg, step), step,
                                  arena)
    swa_meta = swa.build(batch)
    assert swa_meta.dense_decode_lens.tolist() == [299 // 64, 300 // 64]
    assert_swa_matches(swa_meta, expected_for_step(cfg, step))


def test_every_build_agrees_with_the_oracles(extended_table, backend):
    cfg, (indexer, swa), arena, inputs = world(backend)
    examples = 25 if backend == "torch" else 8

    @settings(max_examples=examples)
    @given(host_steps(cfg, max_seq_len=4096))
    def eager(step):
        batch = stage(inputs, step)
        indexer_oracle.assert_matches(indexer.build(batch),
                                      indexer_oracle.indexer_metadata(cfg, step), step, arena)
        assert_swa_matches(swa.build(batch), expected_for_step(cfg, step))

    @settings(max_examples=examples)
    @given(host_steps(cfg, kinds=("uniform_decode",)))
    def decode(step):
        stage(inputs, step)
        batch = Batch.for_decode_capture(inputs, step.num_reqs_padded)
        indexer_oracle.assert_matches(
            indexer.build_decode(batch), indexer_oracle.indexer_metadata(cfg, step, graph=True),
            step, arena)
        assert_swa_matches(swa.build_decode(batch), expected_for_step(cfg, step))

    @settings(max_examples=examples)
    @given(host_steps(cfg, max_seq_len=4096))
    def mixed(step):
        num_reqs, num_tokens = bucket_for(cfg, step.num_tokens,
                                          np.random.default_rng(step.num_tokens))
        check_mixed(cfg, [indexer, swa], inputs, step, num_reqs, num_tokens)

    eager()
    decode()
    mixed()


@pytest.mark.parametrize("block_size, served", [(256, "c4a"), (512, "c8a")])
def test_a_second_topk_type_runs_through_the_real_consumer(extended_table, block_size, served):
    """A model of c4a, c8a and c64a layers: two index types (an indexer each), three
    kv-source types. DeepGEMM's sm90 logits read 64-entry index-K pages, ``block_size // R``
    of them, so one block size serves one of the two top-k types (as V4.1's c1a and c2a):
    256 serves c4a, 512 c8a, each beside the window-only and dense (c64a) layers."""
    cfg = ArenaConfig(
        architecture="deepseek_v4", compress_ratios=(1, 4, 8, 64, 8, 4), sliding_window=64,
        swa_block_size=64, block_size=block_size, max_num_seqs=8, max_num_batched_tokens=16,
        max_model_len=4096, index_topk=64, device=DEVICE, kernel_backend="torch")
    builders = default_builders(cfg)
    assert [b.name for b in builders] == ["indexer.c4a", "indexer.c8a", "compressed", "swa"]
    arena, inputs = make_arena(cfg, builders)
    step = SparseDecodeStep(cfg, topk_types=[served], num_kv_blocks=64, layers_per_type=1,
                            decode_fn=emulated_flash_mla, logits_fn=emulated_paged_mqa_logits)
    assert step.layers == [(0, "swaonly"), (1, served), (2, "c64a")]
    assert step.indexers[served].name == f"indexer.{served}"
    keys, deq = fill_caches(step)
    rng = np.random.default_rng(block_size)
    n, size = cfg.next_n, 8
    for i in range(3):
        new_inputs(step, i)
        k = int(rng.integers(1, size // n + 1))
        s = random_uniform_decode(inputs, k, rng, num_kv_blocks=64, max_seq_len=4096)
        inputs.stage(s.query_lens, s.seq_lens, s.slot_mapping, num_reqs_padded=size // n,
                     num_tokens_padded=size)
        inputs.copy_to_device(size // n, size, uniform=True)
        batch = Batch.for_decode_capture(inputs, size // n)
        out = step(batch, {b.name: b.build_decode(batch) for b in builders})
        assert (out[f"topk.{served}"][: k * n] >= 0).any()
        assert step_problems(step, inputs, s, out, keys, deq) == []
