"""KV-cache layouts the real DeepSeek consumers read, and writers that fill them.

Two layouts, both uint8, both paged (a flat slot is ``block * page + offset``):

* **Indexer K cache** (DeepGEMM paged MQA logits, deepgemm-flashmla.md §1.3):
  ``(num_blocks, 64, 1, D + 4)``. Inside each block the first ``64 * D`` bytes are the
  tokens' e4m3 values, token-major, then ``64 * 4`` bytes of per-token fp32 scales
  (``scale = amax / 448``, value = ``e4m3 * scale``). The block stride is ``64 * (D + 4)``.
* **FlashMLA MODEL1 sparse FP8 cache** (DeepSeek V4, ``d_qk = 512``, §2.4):
  ``(num_blocks, page, 1, 584)``. Per block: ``page`` x (448 e4m3 NoPE bytes + 64 bf16 RoPE
  values = 576 bytes), then ``page`` x 8 bytes of scales: 7 UE8M0 exponents (one per 64 NoPE
  values, ``scale = 2 ** (byte - 127)``, a power of two >= ``amax / 448``) and one pad byte.
  The block stride is ``page * 584`` rounded up to 576 bytes. The second dimension's stride is
  584 (FlashMLA checks it) although the tokens' data are 576 bytes apart: the kernel computes
  the addresses itself.

The writers quantise whole caches from float values (the tests' data, a demo's random
keys); a real engine writes tokens at its slot mapping with its own kernels.
"""

from __future__ import annotations

import torch

from staticattn.arena import round_up

__all__ = [
    "INDEXER_BLOCK", "MODEL1_BYTES_PER_TOKEN", "MODEL1_DIM", "MODEL1_NOPE", "MODEL1_ROPE",
    "MODEL1_TILE", "alloc_indexer_cache", "alloc_model1_cache", "model1_block_bytes",
    "write_indexer_cache", "write_model1_cache",
]

#: Tokens per indexer-cache block (DeepGEMM's ``block_kv`` on sm90).
INDEXER_BLOCK = 64
FP8_MAX = 448.0

MODEL1_NOPE = 448
MODEL1_ROPE = 64
MODEL1_DIM = MODEL1_NOPE + MODEL1_ROPE
MODEL1_TILE = 64
MODEL1_TILES = MODEL1_NOPE // MODEL1_TILE
#: Bytes of one token's values: NoPE e4m3 + RoPE bf16.
MODEL1_TOKEN_DATA = MODEL1_NOPE + 2 * MODEL1_ROPE
#: Scale bytes per token: 7 exponents + 1 pad.
MODEL1_SCALE_BYTES = 8
MODEL1_BYTES_PER_TOKEN = MODEL1_TOKEN_DATA + MODEL1_SCALE_BYTES
_MODEL1_BLOCK_ALIGN = 576


# ------------------------------------------------------------------------- indexer
def alloc_indexer_cache(num_blocks: int, head_dim: int, device) -> torch.Tensor:
    """A zeroed indexer K cache ``(num_blocks, 64, 1, head_dim + 4)`` uint8, contiguous."""
    return torch.zeros(num_blocks, INDEXER_BLOCK, 1, head_dim + 4, dtype=torch.uint8,
                       device=device)


def write_indexer_cache(cache: torch.Tensor, keys: torch.Tensor) -> None:
    """Quantise ``keys`` ``(num_blocks, 64, D)`` (any float dtype) into ``cache`` in place:
    per token ``scale = max(amax, 1e-4) / 448`` (fp32), values ``e4m3(k / scale)``."""
    nb, block, _, width = cache.shape
    d = width - 4
    if keys.shape != (nb, block, d) or not cache.is_contiguous():
        raise ValueError(f"keys must be {(nb, block, d)} for a contiguous cache of shape "
                         f"{tuple(cache.shape)}; got {tuple(keys.shape)}")
    k = keys.float()
    scale = k.abs().amax(dim=-1).clamp(min=1e-4) / FP8_MAX  # (nb, block)
    values = (k / scale.unsqueeze(-1)).to(torch.float8_e4m3fn)
    flat = cache.view(nb, block * width)
    flat[:, : block * d].copy_(values.view(torch.uint8).reshape(nb, block * d))
    flat[:, block * d :].copy_(scale.contiguous().view(torch.uint8).reshape(nb, block * 4))


# -------------------------------------------------------------------------- MODEL1
def model1_block_bytes(page: int) -> int:
    """Bytes between blocks of a MODEL1 cache with ``page`` tokens per block."""
    return round_up(page * MODEL1_BYTES_PER_TOKEN, _MODEL1_BLOCK_ALIGN)


def alloc_model1_cache(num_blocks: int, page: int, device) -> torch.Tensor:
    """A zeroed uint8 MODEL1 cache: the view ``(num_blocks, page, 1, 584)`` (strides
    ``(block_bytes, 584, 584, 1)``) of one ``(num_blocks, block_bytes)`` allocation."""
    raw = torch.zeros(num_blocks, model1_block_bytes(page), dtype=torch.uint8, device=device)
    return raw[:, : page * MODEL1_BYTES_PER_TOKEN].view(num_blocks, page, 1,
                                                       MODEL1_BYTES_PER_TOKEN)


def _model1_rows(cache: torch.Tensor) -> torch.Tensor:
    """The ``(num_blocks, page * 584)`` bytes of every block (a view)."""
    nb, page = cache.shape[:2]
    return torch.as_strided(cache, (nb, page * MODEL1_BYTES_PER_TOKEN), (cache.stride(0), 1))


def write_model1_cache(cache: torch.Tensor, kv: torch.Tensor) -> None:
    """Quantise ``kv`` ``(num_blocks, page, 512)`` into a MODEL1 ``cache`` in place.

    NoPE ``kv[..., :448]`` in 7 tiles of 64: ``scale = 2 ** ceil(log2(max(amax / 448,
    1e-4)))``, values ``e4m3(x / scale)``, exponent byte ``log2(scale) + 127``; RoPE
    ``kv[..., 448:]`` stored as bf16.
    """
    nb, page = cache.shape[:2]
    if kv.shape != (nb, page, MODEL1_DIM):
        raise ValueError(f"kv must be {(nb, page, MODEL1_DIM)}, got {tuple(kv.shape)}")
    rows = _model1_rows(cache)
    data = rows[:, : page * MODEL1_TOKEN_DATA].view(nb, page, MODEL1_TOKEN_DATA)
    scales = rows[:, page * MODEL1_TOKEN_DATA :].view(nb, page, MODEL1_SCALE_BYTES)
    nope = kv[..., :MODEL1_NOPE].float().view(nb, page, MODEL1_TILES, MODEL1_TILE)
    amax = nope.abs().amax(dim=-1) / FP8_MAX  # (nb, page, 7)
    exponent = torch.ceil(torch.log2(amax.clamp(min=1e-4))).to(torch.int32)
    scale = torch.exp2(exponent.float())
    values = (nope / scale.unsqueeze(-1)).to(torch.float8_e4m3fn)
    data[..., :MODEL1_NOPE].copy_(values.view(torch.uint8).view(nb, page, MODEL1_NOPE))
    rope = kv[..., MODEL1_NOPE:].to(torch.bfloat16).contiguous().view(torch.uint8)
    data[..., MODEL1_NOPE:].copy_(rope)
    scales[..., :MODEL1_TILES].copy_((exponent + 127).to(torch.uint8))
    scales[..., MODEL1_TILES:].zero_()
