"""The real-consumer steps on CPU, with torch emulations of DeepGEMM and FlashMLA in place of
the libraries: the plumbing (metadata -> library call -> masking, top-k, the top-k type's
compressed slots, owned outputs) end to end through the graph-safe builds, and the errors
without the libraries. The GPU tests (``test_dsa_*_gpu.py``) run the same drivers on the real
libraries."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.decode_steps import fill_caches, new_inputs, step_problems
from helpers.dsa_reference import (
    emulated_flash_mla,
    emulated_paged_mqa_logits,
    fill_indexer_cache,
    indexer_problems,
    new_indexer_inputs,
)

from staticattn.arena import ArenaConfig
from staticattn.bench.random_batches import random_uniform_decode
from staticattn.builders import Batch, default_builders, make_arena
from staticattn.builders.indexer.builder import IndexerMetadataBuilder
from staticattn.builders.swa.builder import SparseSWAMetadataBuilder
from staticattn.consumers.real.factory import real_consumer_step
from staticattn.consumers.real.indexer_topk import IndexerTopKStep
from staticattn.consumers.real.sparse_decode import SparseDecodeStep
from staticattn.errors import BackendUnavailableError, ConfigError, GraphError
from staticattn.kernels.runtime.dsa_libs import available

BLOCKS = 64


def _v32(**kw):
    base = dict(max_model_len=4096, max_num_seqs=32, max_num_batched_tokens=32, device="cpu",
                kernel_backend="torch", index_topk=128)
    base.update(kw)
    return ArenaConfig.deepseek_v32(**base)


def _v4(**kw):
    base = dict(max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=16, device="cpu",
                kernel_backend="torch", index_topk=128)
    base.update(kw)
    return ArenaConfig.deepseek_v4(**base)


def _decode_step(inputs, builders, step, rng, num_reqs, size):
    """One padded uniform decode step through the graph-safe builds (what a graph holds)."""
    cfg = inputs.config
    s = random_uniform_decode(inputs, num_reqs, rng, num_kv_blocks=BLOCKS)
    inputs.stage(s.query_lens, s.seq_lens, s.slot_mapping,
                 num_reqs_padded=size // cfg.next_n, num_tokens_padded=size)
    inputs.copy_to_device(size // cfg.next_n, size, uniform=True)
    batch = Batch.for_decode_capture(inputs, size // cfg.next_n)
    md = {b.name: b.build_decode(batch) for b in builders}
    return s, step(batch, md)


@pytest.mark.parametrize("make_cfg,sizes", [(_v32, (1, 8, 32)), (_v4, (2, 16)),
                                             (lambda: _v32(num_speculative_tokens=2), (3, 30))])
def test_indexer_step_emulated(make_cfg, sizes):
    cfg = make_cfg()
    builders = [IndexerMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    step = IndexerTopKStep(cfg, num_kv_blocks=BLOCKS, logits_fn=emulated_paged_mqa_logits)
    keys = fill_indexer_cache(step)
    rng = np.random.default_rng(0)
    n = cfg.next_n
    for size in sizes:
        for i in range(6):
            new_indexer_inputs(step, i)
            k = int(rng.integers(1, size // n + 1))
            s, out = _decode_step(inputs, builders, step, rng, k, size)
            assert out.shape == (size, step.topk)
            assert (out[k * n :] == -1).all()
            assert indexer_problems(step, inputs, s, out, keys) == []


def test_indexer_step_in_a_context_bucket_equals_the_capacity_wide_step():
    """A graph captured for a context bucket (``max_seq_len`` = 1024 here, capacity 4096)
    scans 1024 // R keys per token, not 4096 // R, and selects the same keys for steps whose
    sequences fit the bucket; its columns past the bucket's width say "no key" even right
    after a capacity-wide step over long sequences filled them."""
    cfg = _v4(index_topk=512)
    builders = [IndexerMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    step = IndexerTopKStep(cfg, num_kv_blocks=BLOCKS, logits_fn=emulated_paged_mqa_logits)
    assert step.context_width(cfg.max_model_len) == 1024 and step.context_width(1024) == 256
    keys = fill_indexer_cache(step)
    rng = np.random.default_rng(3)
    n, size = cfg.next_n, 8

    def run(s, bound):
        inputs.stage(s.query_lens, s.seq_lens, s.slot_mapping,
                     num_reqs_padded=size // n, num_tokens_padded=size)
        inputs.copy_to_device(size // n, size, uniform=True)
        batch = Batch.for_decode_capture(inputs, size // n, max_seq_len=bound)
        md = {b.name: b.build_decode(batch) for b in builders}
        return step(batch, md).clone()

    filled = 0
    for i in range(8):
        new_indexer_inputs(step, i)
        k = int(rng.integers(1, size // n + 1))
        long = random_uniform_decode(inputs, k, rng, num_kv_blocks=BLOCKS,
                                     short_fraction=0.0)
        filled += int((run(long, None)[:, 256:] >= 0).any())  # columns past 256 in use
        s = random_uniform_decode(inputs, k, rng, num_kv_blocks=BLOCKS, max_seq_len=1024)
        bucket = run(s, 1024)
        assert (bucket[:, 256:] == -1).all()
        assert bucket.tolist() == run(s, None).tolist()
        assert indexer_problems(step, inputs, s, bucket, keys) == []
    assert filled >= 4


def test_attention_step_emulated():
    """FlashMLA alone: the window-only and dense layers, two of each."""
    cfg = _v4()
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    step = SparseDecodeStep(cfg, topk_types=(), num_kv_blocks=BLOCKS,
                            decode_fn=emulated_flash_mla)
    assert [lt for _, lt in step.layers] == ["swaonly", "c128a", "swaonly", "c128a"]
    keys, deq = fill_caches(step, 1)
    rng = np.random.default_rng(1)
    for size in (2, 16):
        for i in range(4):
            new_inputs(step, i)
            k = int(rng.integers(1, size // 2 + 1))
            s, out = _decode_step(inputs, builders, step, rng, k, size)
            assert list(out) == ["attn"] and out["attn"].shape == (size, 4, 64, 512)
            assert not out["attn"][2 * k :].any()
            assert step_problems(step, inputs, s, out, keys, deq) == []


def test_chained_step_emulated():
    """V4 as the one-top-k-type case: the indexer's top-k feeds the top-k type's layers
    through the compressed builder's operand, beside the window-only and dense layers."""
    cfg = _v4()
    builders = default_builders(cfg)
    arena, inputs = make_arena(cfg, builders)
    step = SparseDecodeStep(cfg, num_kv_blocks=BLOCKS, layers_per_type=1,
                            logits_fn=emulated_paged_mqa_logits, decode_fn=emulated_flash_mla)
    assert [lt for _, lt in step.layers] == ["swaonly", "c4a", "c128a"]
    assert list(step.indexers) == ["c4a"] and step.indexers["c4a"].name == "indexer"
    keys, deq = fill_caches(step, 2)
    rng = np.random.default_rng(2)
    for i in range(4):
        new_inputs(step, i)
        k = int(rng.integers(1, 9))
        s, out = _decode_step(inputs, builders, step, rng, k, 16)
        assert (out["topk.c4a"][: 2 * k] >= 0).any()
        assert step_problems(step, inputs, s, out, keys, deq) == []
    with pytest.raises(GraphError, match="CompressedMetadataBuilder"):
        _decode_step(inputs, [b for b in builders if b.name != "compressed"], step, rng, 2, 16)


def test_errors_without_the_libraries():
    if any(available().values()):
        pytest.skip("a real library is importable here")
    assert available() == {"deep_gemm": False, "flash_mla": False}
    with pytest.raises(BackendUnavailableError, match="DeepGEMM"):
        IndexerTopKStep(_v32())
    with pytest.raises(BackendUnavailableError, match="FlashMLA"):
        SparseDecodeStep(_v4())
    with pytest.raises(BackendUnavailableError, match="no real consumer"):
        real_consumer_step(_v4())


def test_config_errors():
    with pytest.raises(ConfigError, match=r"dsa pages hold 128 \(block_size 128 // R 1\)"):
        IndexerTopKStep(_v32(block_size=128), logits_fn=emulated_paged_mqa_logits)
    with pytest.raises(ConfigError, match="sliding_window"):
        SparseDecodeStep(_v32(), decode_fn=emulated_flash_mla)
    with pytest.raises(ConfigError, match=r"topk_types \['c128a'\]: not windowed top-k"):
        SparseDecodeStep(_v4(), topk_types=["c128a"], decode_fn=emulated_flash_mla)
