"""References for the sparse-MLA consumers (DeepSeek V3.2's prefill and decode), written
from ``shared/spec/deepgemm-flashmla.md`` §2.2-§2.5, independent of the package:

* :func:`dequant_ds_mla_cache`: the ``fp8_ds_mla`` layout read back (656 bytes a token);
* :func:`emulated_sparse_fwd`: ``flash_mla.flash_mla_sparse_fwd`` in torch, its signature;
* :func:`emulated_sparse_decode`: ``flash_mla.flash_mla_with_kvcache`` with ``indices=``
  for V3.2 in torch, its signature and its tile-scheduler holder's rule;
* :func:`oracle_attention`: per token, in a plain Python loop, the attention over its
  request's key positions named by its top-k row, read from the cache through the engine's
  block table -- no chunk, no workspace, no flat slot handed in;
* :func:`kernel_abs_tol`: the absolute tolerance a token's output is held to, per device;
* :func:`served_row_problems`: a step's output rows against the oracle where a consumer
  serves the token, :data:`UNTOUCHED` where it does not.
"""

from __future__ import annotations

import numpy as np
import torch

from helpers.dsa_reference import attention_problems

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


def _attend_lse(q: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, scale: float,
                d_v: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)``: fp32 ``(T, H, d_v)``, the softmax over the valid keys of ``scale * q .
    k`` times ``k[:d_v]``, zeros for a token without one; and fp32 ``(T, H)`` its natural
    log-sum-exp, -inf for a token without one. ``keys`` ``(T, N, D)``, ``valid`` ``(T,
    N)``."""
    kf = keys.float()
    s = torch.einsum("thd,tnd->thn", q.float(), kf) * scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, -1, keepdim=True)
    lonely = torch.isinf(lse)
    p = torch.where(valid[:, None, :], torch.exp(s - torch.where(lonely, 0.0, lse)), 0.0)
    return torch.einsum("thn,tnd->thd", p, kf[..., :d_v]), lse[..., 0]


def _attend(q: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, scale: float,
            d_v: int) -> torch.Tensor:
    """The output of :func:`_attend_lse`."""
    return _attend_lse(q, keys, valid, scale, d_v)[0]


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


def emulated_sparse_decode(q, k_cache, block_table, cache_seqlens, head_dim_v,
                           tile_scheduler_metadata, num_splits=None, softmax_scale=None,
                           causal=False, is_fp8_kvcache=False, indices=None, attn_sink=None,
                           extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                           extra_topk_length=None):
    """``flash_mla_with_kvcache`` for V3.2's sparse FP8 decode in torch: ``q`` bf16 ``(b,
    s_q, h, 576)``, ``k_cache`` uint8 ``(num_blocks, 64, 1, 656)``, ``indices`` int32 ``(b,
    s_q, K)`` of flat slots (-1: none) -> ``(out bf16 (b, s_q, h, 512), lse)``, per row the
    softmax over its valid slots' dequantised keys of ``softmax_scale * q . k`` times
    ``k[:512]``, zeros for a row without one; ``lse`` fp32 ``(b, h, s_q)``, the natural
    log-sum-exp of the scaled scores, +inf for a row without a key (as FlashMLA's).

    The holder (``tile_scheduler_metadata``) is planned by the first call and must match on
    later ones, as FlashMLA asserts; what the sm90 V3.2 path rejects is asserted."""
    assert indices is not None and is_fp8_kvcache and not causal and num_splits is None
    assert topk_length is None and attn_sink is None and extra_k_cache is None
    assert extra_indices_in_kvcache is None and extra_topk_length is None
    assert q.dtype == torch.bfloat16 and q.dim() == 4 and q.shape[3] == DIM
    assert q.shape[2] in (64, 128) and head_dim_v == NOPE
    assert k_cache.dtype == torch.uint8 and k_cache.shape[1:] == (PAGE, 1, TOKEN_BYTES)
    b, s_q, h, _ = q.shape
    assert indices.dtype == torch.int32 and indices.shape[:2] == (b, s_q)
    assert indices.shape[2] % 64 == 0, "the sm90 kernel's top-k block"
    shape = (b, s_q, h, indices.shape[2])
    sched = tile_scheduler_metadata
    if sched.have_initialized:
        assert sched.config == shape, "FlashMLA asserts a reused holder's shapes"
    else:
        sched.have_initialized, sched.config = True, shape
    entries = k_cache.reshape(-1, TOKEN_BYTES)
    idx = indices.reshape(b * s_q, -1).long()
    valid = (idx >= 0) & (idx < entries.shape[0])
    keys = dequant_ds_mla_cache(entries[idx.clamp(0, entries.shape[0] - 1)]).view(*idx.shape,
                                                                                   DIM)
    out, lse = _attend_lse(q.reshape(b * s_q, h, DIM), keys, valid, softmax_scale, NOPE)
    # FlashMLA's LSE: (b, h, s_q), +inf for a row without a key.
    lse = lse.masked_fill(lse == float("-inf"), float("inf"))
    return (out.to(torch.bfloat16).view(b, s_q, h, NOPE),
            lse.view(b, s_q, h).transpose(1, 2))


def _token_slots(block_table: np.ndarray, query_lens: np.ndarray, seq_lens: np.ndarray,
                 topk: np.ndarray):
    """Per token of the step (request-major), the cache slots of the key positions ``j``
    of its top-k row with ``0 <= j <= p`` (``p`` its position): ``block_table[b, j // 64]
    * 64 + j % 64``, as int64 tensors (maybe empty)."""
    t = 0
    for b, (n, length) in enumerate(zip(query_lens.tolist(), seq_lens.tolist())):
        for i in range(n):
            p = length - n + i
            yield torch.tensor([int(block_table[b, j // PAGE]) * PAGE + j % PAGE
                                for j in topk[t].tolist() if 0 <= j <= p], dtype=torch.int64)
            t += 1


def oracle_attention(q: torch.Tensor, cache: torch.Tensor, block_table: np.ndarray,
                     query_lens: np.ndarray, seq_lens: np.ndarray, topk: np.ndarray,
                     scale: float, tokens: int | None = None) -> torch.Tensor:
    """fp32 ``(tokens, H, 512)`` for the first ``tokens`` of the step (default all;
    request-major, decode or prefill alike): the attention over the keys of
    :func:`_token_slots`; zeros for a token with none."""
    deq = dequant_ds_mla_cache(cache)
    slots = list(_token_slots(block_table, query_lens, seq_lens, topk))[:tokens]
    n = max([len(s) for s in slots] + [1])
    # The slots padded to one width, so that one batched softmax serves every token.
    index = torch.zeros(len(slots), n, dtype=torch.int64)
    valid = torch.zeros(len(slots), n, dtype=torch.bool)
    for t, s in enumerate(slots):
        index[t, : len(s)], valid[t, : len(s)] = s, True
    return _attend(q[: len(slots)], deq[index], valid, scale, NOPE)


#: The absolute tolerance of ``attention_problems`` on the emulations (fp32 softmax).
ABS_TOL = 1e-2
#: FlashMLA's sm90 sparse kernels round the softmax probabilities to bf16 (unit roundoff
#: ``u = 2 ** -8``) for the P.V product, and divide by a sum of fp32 or of rounded
#: probabilities: the normalised weights ``w_i (1 + d_i) / (1 + d)`` with ``|d_i|, |d| <=
#: u`` move the output by at most ``2 u max_i |v_i|`` (``sum_i w_i (d_i - d) = 0``).
#: Keys whose 128-value tiles are scaled up to ``2 ** 3`` reach ``|v| ~ 30``: ~0.25 in the
#: worst case, far beyond ``ABS_TOL``; the emulations keep fp32 weights, so CPU stays at
#: ``ABS_TOL``.
P_ROUNDING = 2.0 ** -7


def kernel_abs_tol(device: torch.device, cache: torch.Tensor, block_table: np.ndarray,
                   query_lens: np.ndarray, seq_lens: np.ndarray, topk: np.ndarray,
                   merged: bool = False) -> torch.Tensor:
    """fp32 ``(T, 1, 1)`` by token: :data:`ABS_TOL`, and at least :data:`P_ROUNDING` times
    the largest ``|v|`` (NoPE value) of the token's keys for each rounding the output went
    through: FlashMLA's bf16 probabilities on CUDA; with ``merged`` (decode context
    parallelism) the ranks' partial outputs, bf16 before their merge (each off by ``u
    |o_r|``, weights summing to 1), and the merged sum's own rounding to bf16."""
    tol = torch.full((int(query_lens.sum()), 1, 1), ABS_TOL)
    roundings = (device.type == "cuda") + merged
    if not roundings:
        return tol
    nope = dequant_ds_mla_cache(cache.cpu())[:, :NOPE].float().abs().amax(-1)
    for t, slots in enumerate(_token_slots(block_table, query_lens, seq_lens, topk)):
        if slots.numel():
            tol[t] = max(ABS_TOL, roundings * P_ROUNDING * float(nope[slots].max()))
    return tol


#: What a consumer must not write: the output rows of the tokens it does not serve start so.
UNTOUCHED = 7.0


def served_row_problems(got: torch.Tensor, ref: torch.Tensor, served: torch.Tensor,
                        tol=ABS_TOL) -> list[str]:
    """Problems of a consumer's output rows ``got`` (``(T, H, 512)``, CPU): where ``served``
    (bool ``(T,)``) against ``ref`` (the served tokens' oracle rows, in order; ``tol`` a
    float or per served token ``(n, 1, 1)``), and every other row still :data:`UNTOUCHED`."""
    problems = attention_problems(got[served], ref, abs_tol=tol)
    if not (got[~served] == UNTOUCHED).all():
        problems.append("a row of a token the consumer does not serve was written")
    return problems


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
