"""The sparse decode consumer on a DeepSeek V4.1 config (two top-k types), on CPU, DeepGEMM
and FlashMLA emulated: per top-k type the indexer's top-k over the type's ``index_k`` table,
its compressed slots through the compressed builder's ``decode_topk``, FlashMLA per layer
type (window + the type's keys), every output against torch references; and the typed
errors for what the SM90 kernels do not serve (c2a's 32-entry index-K pages on the SM90
block, c1a's 128-entry ones on SM100's)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.decode_steps import fill_caches, new_inputs, step_problems
from helpers.dsa_reference import emulated_flash_mla, emulated_paged_mqa_logits

from staticattn.arena import ArenaConfig
from staticattn.bench.random_batches import random_uniform_decode
from staticattn.builders import Batch, default_builders, make_arena
from staticattn.consumers.real.indexer_topk import IndexerTopKStep
from staticattn.consumers.real.sparse_decode import SparseDecodeStep
from staticattn.errors import ConfigError

BLOCKS = 64
EMULATED = dict(decode_fn=emulated_flash_mla, logits_fn=emulated_paged_mqa_logits)


def _v41(**kw) -> ArenaConfig:
    base = dict(max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=16, device="cpu",
                kernel_backend="torch")
    return ArenaConfig.preset("deepseek-v4.1-flash", **{**base, **kw})


@pytest.mark.parametrize("block_size, served", [(64, "c1a"), (128, "c2a")])
def test_v41_decode_step_emulated(block_size, served):
    cfg = _v41(block_size=block_size)
    builders = default_builders(cfg)
    arena, inputs = make_arena(cfg, builders)
    step = SparseDecodeStep(cfg, topk_types=[served], num_kv_blocks=BLOCKS, layers_per_type=1,
                            **EMULATED)
    assert [t for _, t in step.layers] == ["swaonly", served]
    keys, deq = fill_caches(step)
    rng = np.random.default_rng(block_size)
    n, size = cfg.next_n, 8
    for i in range(4):
        new_inputs(step, i)
        k = int(rng.integers(1, size // n + 1))
        s = random_uniform_decode(inputs, k, rng, num_kv_blocks=BLOCKS, max_seq_len=4096)
        inputs.stage(s.query_lens, s.seq_lens, s.slot_mapping, num_reqs_padded=size // n,
                     num_tokens_padded=size)
        inputs.copy_to_device(size // n, size, uniform=True)
        batch = Batch.for_decode_capture(inputs, size // n)
        out = step(batch, {b.name: b.build_decode(batch) for b in builders})
        assert out["attn"].shape[:2] == (size, 2)
        assert (out["attn"][k * n:] == 0).all()
        assert step_problems(step, inputs, s, out, keys, deq) == []


def test_what_the_sm90_kernels_do_not_serve_is_a_typed_error_naming_the_shape():
    with pytest.raises(ConfigError, match=r"index type 'c2a': DeepGEMM's sm90 paged MQA logits "
                       r"read index-K pages of 64 entries .* but c2a pages hold 32 "
                       r"\(block_size 64 // R 2\); block_size 128 would serve it"):
        SparseDecodeStep(_v41(), num_kv_blocks=BLOCKS, **EMULATED)
    with pytest.raises(ConfigError, match=r"c1a pages hold 128 \(block_size 128 // R 1\)"):
        SparseDecodeStep(_v41(block_size=128), num_kv_blocks=BLOCKS, **EMULATED)
    with pytest.raises(ConfigError, match=r"topk_types \['swaonly'\]: not windowed top-k"):
        SparseDecodeStep(_v41(), topk_types=["swaonly"], **EMULATED)
    with pytest.raises(ConfigError, match="index_type 'c4a'"):
        IndexerTopKStep(_v41(), index_type="c4a", logits_fn=emulated_paged_mqa_logits)
    with pytest.raises(ConfigError, match="name the one an indexer serves"):
        IndexerTopKStep(_v41(), logits_fn=emulated_paged_mqa_logits)


def test_the_large_preset_keeps_1024_keys_per_type():
    cfg = _v41(index_topk=1024)
    step = SparseDecodeStep(cfg, topk_types=["c1a"], num_kv_blocks=BLOCKS, **EMULATED)
    assert step.indexers["c1a"].topk == 1024 and step.indexers["c1a"].name == "indexer.c1a"
    with pytest.raises(ConfigError, match=r"keep \[512\] keys, the layers take "
                       "index_topk=1024"):
        SparseDecodeStep(_v41(index_topk=1024, max_model_len=512), topk_types=["c1a"],
                         num_kv_blocks=BLOCKS, **EMULATED)
