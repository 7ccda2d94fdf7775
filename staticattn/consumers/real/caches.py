"""KV-cache layouts the real DeepSeek consumers read, and writers that fill them.

Three layouts, all uint8, all paged (a flat slot is ``block * page + offset``):

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
* **FlashMLA V3.2 ``fp8_ds_mla`` cache** (DeepSeek V3.2, ``d_qk = 576``, §2.4-§2.5):
  ``(num_blocks, 64, 1, 656)``, contiguous, token-major: per token 512 e4m3 NoPE bytes in 4
  tiles of 128, the 4 tiles' fp32 scales (16 bytes; powers of two, ``2 ** ceil(log2(amax /
  448))``), then the 64 RoPE values as bf16 (128 bytes). The sparse decode kernel reads it
  as is; the sparse prefill kernel takes bf16 keys, so its consumer dequantises the rows it
  needs (:class:`DsMlaRows`).

The writers quantise whole caches from float values (the tests' data, a demo's random
keys); a real engine writes tokens at its slot mapping with its own kernels.
"""

from __future__ import annotations

import torch

from staticattn.arena import round_up

__all__ = [
    "DS_MLA_BLOCK", "DS_MLA_BYTES_PER_TOKEN", "DS_MLA_DIM", "DS_MLA_NOPE", "DsMlaRows",
    "INDEXER_BLOCK", "MODEL1_BYTES_PER_TOKEN", "MODEL1_DIM", "MODEL1_NOPE", "MODEL1_ROPE",
    "MODEL1_TILE", "alloc_ds_mla_cache", "alloc_indexer_cache", "alloc_model1_cache",
    "model1_block_bytes", "write_ds_mla_cache", "write_indexer_cache", "write_model1_cache",
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

#: Tokens per ``fp8_ds_mla`` block (the V3.2 KV cache's page).
DS_MLA_BLOCK = 64
DS_MLA_NOPE = 512
DS_MLA_ROPE = 64
DS_MLA_DIM = DS_MLA_NOPE + DS_MLA_ROPE
DS_MLA_TILE = 128
DS_MLA_TILES = DS_MLA_NOPE // DS_MLA_TILE
#: Byte offsets in a token's entry: the scales after the NoPE bytes, the RoPE after them.
_DS_MLA_SCALES_AT = DS_MLA_NOPE
_DS_MLA_ROPE_AT = DS_MLA_NOPE + 4 * DS_MLA_TILES
DS_MLA_BYTES_PER_TOKEN = _DS_MLA_ROPE_AT + 2 * DS_MLA_ROPE  # 512 + 16 + 128 = 656


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


# ------------------------------------------------------------------------ fp8_ds_mla
def alloc_ds_mla_cache(num_blocks: int, device) -> torch.Tensor:
    """A zeroed V3.2 ``fp8_ds_mla`` cache, uint8 ``(num_blocks, 64, 1, 656)``, contiguous."""
    return torch.zeros(num_blocks, DS_MLA_BLOCK, 1, DS_MLA_BYTES_PER_TOKEN, dtype=torch.uint8,
                       device=device)


def write_ds_mla_cache(cache: torch.Tensor, kv: torch.Tensor) -> None:
    """Quantise ``kv`` ``(num_blocks, 64, 576)`` (any float dtype) into ``cache`` in place.

    NoPE ``kv[..., :512]`` in 4 tiles of 128: ``scale = 2 ** ceil(log2(max(amax, 1e-4) /
    448))`` (fp32), values ``e4m3(x / scale)``; RoPE ``kv[..., 512:]`` stored as bf16.
    """
    nb, page = cache.shape[:2]
    if (kv.shape != (nb, page, DS_MLA_DIM) or page != DS_MLA_BLOCK
            or cache.shape[2:] != (1, DS_MLA_BYTES_PER_TOKEN) or not cache.is_contiguous()):
        raise ValueError(f"kv must be {(nb, DS_MLA_BLOCK, DS_MLA_DIM)} for a contiguous cache "
                         f"of shape {(nb, DS_MLA_BLOCK, 1, DS_MLA_BYTES_PER_TOKEN)}; got kv "
                         f"{tuple(kv.shape)}, cache {tuple(cache.shape)}")
    entries = cache.view(nb, page, DS_MLA_BYTES_PER_TOKEN)
    nope = kv[..., :DS_MLA_NOPE].float().reshape(nb, page, DS_MLA_TILES, DS_MLA_TILE)
    amax = nope.abs().amax(dim=-1).clamp(min=1e-4)  # (nb, page, 4)
    scale = torch.exp2(torch.ceil(torch.log2(amax / FP8_MAX)))
    values = (nope / scale.unsqueeze(-1)).to(torch.float8_e4m3fn)
    entries[..., :DS_MLA_NOPE].copy_(values.view(torch.uint8).view(nb, page, DS_MLA_NOPE))
    entries[..., _DS_MLA_SCALES_AT:_DS_MLA_ROPE_AT].copy_(
        scale.contiguous().view(torch.uint8).view(nb, page, 4 * DS_MLA_TILES))
    rope = kv[..., DS_MLA_NOPE:].to(torch.bfloat16).contiguous().view(torch.uint8)
    entries[..., _DS_MLA_ROPE_AT:].copy_(rope)


class DsMlaRows:
    """Reads ``fp8_ds_mla`` entries by flat slot into bf16 ``(n, 576)`` rows, through one
    owned byte buffer (graph-safe: fixed shapes, no host read, no allocation).

    A NoPE value is ``e4m3 * scale``; the scale is a power of two, so the product is exact
    in bf16 (its 8 mantissa bits hold e4m3's 4) and the dequantisation multiplies in bf16.

    Parameters
    ----------
    kv_cache : uint8 ``(num_blocks, 64, 1, 656)``, contiguous
    rows : int
        Capacity: the most entries one :meth:`read` takes.
    """

    def __init__(self, kv_cache: torch.Tensor, rows: int) -> None:
        nb = kv_cache.shape[0]
        if (kv_cache.dtype != torch.uint8 or not kv_cache.is_contiguous()
                or kv_cache.shape[1:] != (DS_MLA_BLOCK, 1, DS_MLA_BYTES_PER_TOKEN)):
            raise ValueError(f"an fp8_ds_mla cache is uint8 (num_blocks, {DS_MLA_BLOCK}, 1, "
                             f"{DS_MLA_BYTES_PER_TOKEN}), contiguous; got {kv_cache.dtype} "
                             f"{tuple(kv_cache.shape)}")
        self._entries = kv_cache.view(nb * DS_MLA_BLOCK, DS_MLA_BYTES_PER_TOKEN)
        dev = kv_cache.device
        self._bytes = torch.empty(rows, DS_MLA_BYTES_PER_TOKEN, dtype=torch.uint8, device=dev)
        self._scales = torch.empty(rows, DS_MLA_TILES, 1, dtype=torch.bfloat16, device=dev)

    def read(self, slots: torch.Tensor, out: torch.Tensor) -> None:
        """``out[i]`` = the entry at flat slot ``slots[i]`` (``block * 64 + offset``),
        dequantised: NoPE in ``[:512]``, RoPE in ``[512:]``.

        slots : int64 ``(n,)``, in range; out : bf16 ``(n, 576)``, its last dim contiguous.
        """
        n = slots.shape[0]
        raw = self._bytes[:n]
        torch.index_select(self._entries, 0, slots, out=raw)
        nope = out[:, :DS_MLA_NOPE].view(n, DS_MLA_TILES, DS_MLA_TILE)
        nope.copy_(raw[:, :DS_MLA_NOPE].view(torch.float8_e4m3fn)
                   .view(n, DS_MLA_TILES, DS_MLA_TILE))
        scales = self._scales[:n]
        scales.copy_(raw[:, _DS_MLA_SCALES_AT:_DS_MLA_ROPE_AT].view(torch.float32)
                     .view(n, DS_MLA_TILES, 1))
        nope.mul_(scales)
        out[:, DS_MLA_NOPE:].copy_(raw[:, _DS_MLA_ROPE_AT:].view(torch.bfloat16))
