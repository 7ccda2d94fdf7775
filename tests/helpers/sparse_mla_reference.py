"""References for the sparse-MLA prefill consumer (DeepSeek V3.2), written from
``shared/spec/deepgemm-flashmla.md`` §2.4-§2.5, independent of the package:

* :func:`dequant_ds_mla_cache`: the ``fp8_ds_mla`` layout read back (656 bytes a token);
* :func:`emulated_sparse_fwd`: ``flash_mla.flash_mla_sparse_fwd`` in torch, its signature;
* :func:`oracle_prefill_attention`: per token, in a plain Python loop, the attention over its
  request's key positions named by its top-k row, read from the cache through the engine's
  block table -- no chunk, no workspace.
"""

from __future__ import annotations

import numpy as np
import torch

NOPE, ROPE, TILE, PAGE = 512, 64, 128, 64
DIM = NOPE + ROPE
TOKEN_BYTES = NOPE + 4 * (NOPE // TILE) + 2 * ROPE  # 656


def dequant_ds_mla_cache(cache: torch.Tensor) -> torch.Tensor:
    """uint8 ``(nb, 64, 1, 656)`` -> bf16 ``(nb * 64, 576)`` by flat slot: per token 512
    e4m3 bytes (tile ``i`` of 128 times the ``i``-th fp32 of the 16 bytes after them), then
    64 bf16 RoPE values."""
    rows = cache.reshape(-1, TOKEN_BYTES)
    nope = rows[:, :NOPE].contiguous().view(torch.float8_e4m3fn).float()
    scales = rows[:, NOPE : NOPE + 16].contiguous().view(torch.float32)
    nope = (nope.view(-1, NOPE // TILE, TILE) * scales.unsqueeze(-1)).view(-1, NOPE)
    rope = rows[:, NOPE + 16 :].contiguous().view(torch.bfloat16).float()
    return torch.cat([nope, rope], -1).to(torch.bfloat16)


def _attend(q: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, scale: float,
            d_v: int) -> torch.Tensor:
    """fp32 ``(T, H, d_v)``: softmax over the valid keys of ``scale * q . k`` times
    ``k[:d_v]``; zeros for a token without one. ``keys`` ``(T, N, D)``, ``valid`` ``(T, N)``."""
    kf = keys.float()
    s = torch.einsum("thd,tnd->thn", q.float(), kf) * scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, -1, keepdim=True)
    lonely = torch.isinf(lse)
    p = torch.where(valid[:, None, :], torch.exp(s - torch.where(lonely, 0.0, lse)), 0.0)
    return torch.einsum("thn,tnd->thd", p, kf[..., :d_v])


def emulated_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None):
    """``flash_mla_sparse_fwd`` in torch: ``q`` bf16 ``(s_q, h, 576)``, ``kv`` bf16 ``(s_kv,
    1, 576)``, ``indices`` int32 ``(s_q, 1, K)`` (-1 or ``>= s_kv``: not a key) -> ``(out
    bf16 (s_q, h, d_v), max_logits, lse)`` (the last two not computed: the consumer drops
    them)."""
    assert attn_sink is None and topk_length is None
    assert q.dtype == kv.dtype == torch.bfloat16 and indices.dtype == torch.int32
    s_q, _, d = q.shape
    assert kv.shape[1:] == (1, d) and indices.shape[:2] == (s_q, 1)
    assert indices.shape[2] % 128 == 0 and q.shape[1] % 64 == 0, "the sm90 kernel's limits"
    idx = indices[:, 0].long()
    valid = (idx >= 0) & (idx < kv.shape[0])
    keys = kv[:, 0][idx.clamp(0, kv.shape[0] - 1)]
    out = _attend(q, keys, valid, sm_scale, d_v)
    return out.to(torch.bfloat16), None, None


def oracle_prefill_attention(q: torch.Tensor, cache: torch.Tensor, block_table: np.ndarray,
                             query_lens: np.ndarray, seq_lens: np.ndarray, topk: np.ndarray,
                             scale: float) -> torch.Tensor:
    """fp32 ``(T, H, 512)`` by token of the step (request-major): the attention over the key
    positions ``j`` of its top-k row with ``0 <= j <= p`` (``p`` its position), key ``j`` at
    slot ``block_table[b, j // 64] * 64 + j % 64``; zeros for a token with none."""
    deq = dequant_ds_mla_cache(cache)
    out = torch.zeros(int(query_lens.sum()), q.shape[1], NOPE)
    t = 0
    for b, (n, length) in enumerate(zip(query_lens.tolist(), seq_lens.tolist())):
        for i in range(n):
            p = length - n + i
            slots = [int(block_table[b, j // PAGE]) * PAGE + j % PAGE
                     for j in topk[t].tolist() if 0 <= j <= p]
            if slots:
                keys = deq[torch.tensor(slots, dtype=torch.int64)].view(1, len(slots), DIM)
                valid = torch.ones(1, len(slots), dtype=torch.bool)
                out[t] = _attend(q[t : t + 1], keys, valid, scale, NOPE)[0]
            t += 1
    return out


def draw_topk(rng: np.random.Generator, query_lens: np.ndarray, seq_lens: np.ndarray,
              width: int, rows: int) -> np.ndarray:
    """int32 ``(rows, width)`` top-k rows for the step's tokens (request-major), -1 past
    them: per token at position ``p``, distinct positions of ``[0, p]`` in random slots of
    the row, -1 elsewhere -- sometimes every key that fits, sometimes fewer, now and then a
    position past ``p`` (no key of the token's, to be ignored)."""
    out = np.full((rows, width), -1, dtype=np.int32)
    t = 0
    for n, length in zip(query_lens.tolist(), seq_lens.tolist()):
        for i in range(n):
            keys = length - n + i + 1
            fit = min(width, keys)
            count = fit if rng.random() < 0.5 else int(rng.integers(0, fit + 1))
            chosen = rng.choice(keys, size=count, replace=False)
            if count < width and rng.random() < 0.2:
                chosen = np.append(chosen, keys + int(rng.integers(0, 5)))
            out[t, rng.choice(width, size=chosen.size, replace=False)] = chosen
            t += 1
    return out
