"""The sparse-MLA consumers' test setting (DeepSeek V3.2's prefill and decode): the devices
they run on, an ``fp8_ds_mla`` cache of keys whose 128-value tiles have unlike magnitudes,
and a step's fresh queries and top-k rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers.sparse_mla_reference import draw_topk
from staticattn.consumers.real.caches import alloc_ds_mla_cache, write_ds_mla_cache
from staticattn.kernels.runtime.dsa_libs import FLASH_MLA, import_error

#: CPU: the kernels' torch emulations; CUDA: FlashMLA's sm90 kernels.
DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(bool(import_error(FLASH_MLA)), reason=str(import_error(FLASH_MLA)))])]


def tiled_cache(blocks: int, device) -> torch.Tensor:
    """An ``fp8_ds_mla`` cache of ``blocks`` pages of random keys, each NoPE tile of 128
    scaled by ``2 ** (-3..3)``: a scale read for the wrong tile shows."""
    cache = alloc_ds_mla_cache(blocks, device)
    g = torch.Generator().manual_seed(0)
    kv = torch.randn(blocks, 64, 576, generator=g)
    tiles = kv[..., :512].view(blocks, 64, 4, 128)
    tiles.mul_(torch.exp2(torch.randint(-3, 4, (blocks, 64, 4, 1), generator=g).float()))
    write_ds_mla_cache(cache, kv.to(device))
    return cache


def new_inputs(q: torch.Tensor, step, width: int, seed: int) -> np.ndarray:
    """Fill ``q`` with random bf16 queries; the step's top-k rows (:func:`draw_topk`, ``q``'s
    rows of them)."""
    rng = np.random.default_rng(seed)
    q.copy_(torch.from_numpy(rng.standard_normal(q.shape, dtype=np.float32))
            .to(torch.bfloat16).to(q.device))
    return draw_topk(rng, step.query_lens, step.seq_lens, width, step.num_tokens)
