"""The real consumers' cache layouts: the package's writers against the tests' independent
readers (CPU; the GPU tests then check the layouts against the kernels themselves)."""

from __future__ import annotations

import torch
from helpers.dsa_reference import dequant_indexer_cache, dequant_model1_cache

from staticattn.consumers.real.caches import (
    MODEL1_BYTES_PER_TOKEN,
    alloc_indexer_cache,
    alloc_model1_cache,
    model1_block_bytes,
    write_indexer_cache,
    write_model1_cache,
)


def test_indexer_cache_round_trip():
    gen = torch.Generator().manual_seed(0)
    keys = torch.randn(5, 64, 128, generator=gen) * torch.rand(5, 64, 1, generator=gen) * 4
    keys[2, 7] = 0.0  # an all-zero token: the scale floor keeps it finite
    cache = alloc_indexer_cache(5, 128, "cpu")
    assert cache.shape == (5, 64, 1, 132) and cache.stride() == (64 * 132, 132, 132, 1)
    write_indexer_cache(cache, keys)
    back = dequant_indexer_cache(cache)
    assert torch.isfinite(back).all()
    assert torch.equal(back[2, 7], torch.zeros(128))
    # e4m3 keeps 3 mantissa bits: relative error <= 2**-4 of the token's amax
    amax = keys.abs().amax(-1, keepdim=True)
    assert ((back - keys).abs() <= amax * 2**-4 + 1e-6).all()


def test_indexer_cache_layout_bytes():
    cache = alloc_indexer_cache(1, 32, "cpu")
    keys = torch.zeros(1, 64, 32)
    keys[0, 3, 5] = 448.0  # scale 1.0 for token 3, e4m3 448 = 0x7e
    write_indexer_cache(cache, keys)
    flat = cache.view(-1)
    assert int(flat[3 * 32 + 5]) == 0x7E
    scale = flat[64 * 32 + 3 * 4 : 64 * 32 + 4 * 4].view(torch.float32)
    assert float(scale) == 1.0


def test_model1_cache_round_trip():
    gen = torch.Generator().manual_seed(1)
    for page in (64, 2):
        kv = (torch.randn(3, page, 512, generator=gen) * 3).to(torch.bfloat16)
        cache = alloc_model1_cache(3, page, "cpu")
        assert cache.shape == (3, page, 1, MODEL1_BYTES_PER_TOKEN)
        assert cache.stride(0) == model1_block_bytes(page) and cache.stride(1) == 584
        assert model1_block_bytes(page) % 576 == 0
        write_model1_cache(cache, kv)
        back = dequant_model1_cache(cache).view(3, page, 512).float()
        ref = kv.float()
        assert torch.equal(back[..., 448:], ref[..., 448:])  # RoPE is stored exactly
        tiles = ref[..., :448].view(3, page, 7, 64)
        amax = tiles.abs().amax(-1, keepdim=True)
        err = (back[..., :448].view(3, page, 7, 64) - tiles).abs()
        # power-of-two scale <= 2 * amax / 448; e4m3 relative step 2**-3
        assert (err <= amax * 2**-3 + 1e-6).all()


def test_model1_scale_bytes_are_ue8m0():
    cache = alloc_model1_cache(1, 2, "cpu")
    kv = torch.zeros(1, 2, 512)
    kv[0, 1, 64:128] = 448.0 * 4  # tile 1 of token 1: scale 4 = 2**2 -> byte 129
    write_model1_cache(cache, kv)
    rows = torch.as_strided(cache, (1, 2 * 584), (cache.stride(0), 1))
    scales = rows[0, 2 * 576 :].view(2, 8)
    assert int(scales[1, 1]) == 129 and int(scales[1, 7]) == 0
    assert int(scales[0, 0]) == 127 - 13  # all-zero tile: ceil(log2(1e-4)) = -13
