"""FlashInfer index rows in paged coordinates (``docs/spec/deepseek-v41.md`` §7.3,
``vllm-0.33-extras.md`` §5.3 without images or packed pages): one row per token of the
step, decodes first, ``W`` SWA slots then ``round_up(K, 4)`` compressed global slots.

For token ``t`` of request ``b`` at position ``p`` (``valid``: its slot is not -1):

* SWA columns ``[0, W)``: the flat SWA slots of the window ``[start, p]``, ``start =
  max(p - W + 1, 0)`` for a decode and ``max(p - W + 1, replay_start[b])`` for a prefill
  token; -1 after, and a row of -1 for an invalid token;
* compressed columns ``W + c``: the top-k entry ``k = topk[t, c]`` as its global slot
  ``cbt[b, k // S] * S + k % S`` (``S`` entries per page of the layer's compressed block
  table) if ``k >= 0``, else -1. A decode takes every column ``c < K``; a prefill token the
  first ``min(n_c(p), K)``, ``n_c(p) = (p + 1) // R``; -1 after; an invalid token none;
* length: a decode ``W + #(k >= 0)`` (0 compressed for an invalid token), a prefill token
  ``W + min(n_c(p), K)`` (``W`` for an invalid token): the length counts the whole SWA width,
  -1 slots included, as the reference's does.

Rows past the real tokens: -1 and length 0 (the reference leaves them unwritten). Example
(deepseek-v41.md §11 case 2, W = 4, K = 4, c1a, S = 8): decode ``L = 6`` with SWA row
``[10, 11, 28, 29]`` and top-k ``[5, 0, 3, -1]`` through compressed row ``[3, ...]`` ->
``[10, 11, 28, 29, 29, 24, 27, -1]``, length 7.
"""

from __future__ import annotations

import torch

from staticattn.kernels.runtime.backend import triton_interpreted
from staticattn.kernels.runtime.compiled_launch import grid_size, launch
from staticattn.kernels.runtime.deferred import lazy_jit
from staticattn.kernels.staging.stage_inputs import COUNT_DECODE_TOKENS, COUNT_TOKENS
from staticattn.kernels.staging.step_counts import step_counts_jit
from staticattn.kernels.swa.swa_rows_torch import gather_slots, window_start
from staticattn.kernels.swa.window import window_rows_jit

__all__ = ["flashinfer_rows"]


def flashinfer_rows(
    backend: str,
    out: torch.Tensor,
    lens_out: torch.Tensor,
    slot_mapping: torch.Tensor,
    positions: torch.Tensor,
    token_to_req: torch.Tensor,
    swa_block_table: torch.Tensor,
    replay_start: torch.Tensor | None,
    topk: torch.Tensor | None,
    compressed_block_table: torch.Tensor | None,
    *,
    swa_block_size: int,
    window: int,
    topk_width: int,
    ratio: int,
    entries_per_page: int,
    num_tokens: int,
    counts: tuple[int, int] | torch.Tensor,
) -> None:
    """Write the FlashInfer rows of tokens ``[0, num_tokens)`` (module docstring).

    Parameters
    ----------
    out : int32 ``(>= num_tokens, W + round_up(K, 4))``, contiguous rows
    lens_out : int32 ``(>= num_tokens,)``
    slot_mapping, positions : int64 ``(>= num_tokens,)``;  token_to_req : int32
    swa_block_table : int32 ``(num_reqs, cols)``, ``swa_block_size`` tokens per block
    replay_start : int32 ``(num_reqs,)`` or None
    topk : int32 ``(>= num_tokens, >= K)`` or None (``K = 0``: an SWA-only layer)
        The layer's top-k rows by token: local compressed indices, -1 padded.
    compressed_block_table : int32 ``(num_reqs, cols)`` or None
        The layer's compressed cache group, ``entries_per_page`` entries per page.
    topk_width : int
        ``K``.
    ratio : int
        ``R`` of the layer (prefill lengths ``min((p + 1) // R, K)``).
    counts : ``(Td, nt)`` static ints, or the staging's ``step_counts``.
    """
    if num_tokens == 0:
        return
    device_counts = isinstance(counts, torch.Tensor)
    has_topk = topk is not None and topk_width > 0
    if backend == "triton":
        td, nt = (0, 0) if device_counts else counts
        rows = 16 if triton_interpreted() else 2
        cbt = compressed_block_table if has_topk else swa_block_table
        launch(_flashinfer_kernel(), (grid_size(num_tokens, rows),),
            out, lens_out, slot_mapping, positions, token_to_req, swa_block_table,
            swa_block_table.stride(0), lens_out if replay_start is None else replay_start,
            topk if has_topk else lens_out, topk.stride(0) if has_topk else 0, cbt,
            cbt.stride(0), lens_out if not device_counts else counts, td, nt, num_tokens,
            topk_width if has_topk else 0, ratio, entries_per_page, out.shape[1],
            WINDOW=window, SWA_BLOCK=swa_block_size, HAS_REPLAY=replay_start is not None,
            HAS_TOPK=has_topk, DEVICE_COUNTS=device_counts, ROWS=rows,
            BLOCK_W=max(1 << (window - 1).bit_length(), 16), BLOCK_K=128,
        )
        return
    dev = positions.device
    if device_counts:
        td, nt = counts[COUNT_DECODE_TOKENS], counts[COUNT_TOKENS]
    else:
        td, nt = (torch.full((), c, device=dev) for c in counts)
    t = torch.arange(num_tokens, device=dev)
    real = t < nt
    decode = (t < td)[:, None]
    valid = (real & (slot_mapping[:num_tokens] >= 0))[:, None]
    req = token_to_req[:num_tokens, None]
    pos = positions[:num_tokens, None].int()
    rs = None if replay_start is None else torch.where(decode, 0, replay_start[req])
    start, n = window_start(pos, window, rs)
    swa = gather_slots(swa_block_table, req, start, n, valid, window, swa_block_size)
    width = out.shape[1] - window
    c = torch.arange(width, device=dev)[None, :]
    if has_topk:
        n_c = (pos + 1).clamp(min=0) // ratio if ratio else torch.zeros_like(pos)
        take = torch.where(decode, topk_width, n_c.clamp(max=topk_width))
        k = topk[:num_tokens, :topk_width].long()
        k = torch.nn.functional.pad(k, (0, width - topk_width), value=-1)
        keep = valid & (c < take) & (k >= 0)
        entry = torch.where(keep, k, 0)
        blocks = compressed_block_table[req, entry // entries_per_page]
        compressed = torch.where(keep, blocks * entries_per_page + entry % entries_per_page, -1)
        extra = torch.where(decode, keep.sum(1, keepdim=True), take)
        extra = torch.where(valid, extra, 0)
    else:
        compressed = torch.full((num_tokens, width), -1, device=dev, dtype=swa.dtype)
        extra = torch.zeros_like(pos)
    out[:num_tokens].copy_(torch.where(real[:, None], torch.cat([swa, compressed], 1), -1))
    lens_out[:num_tokens].copy_(torch.where(real[:, None], window + extra, 0)[:, 0])


@lazy_jit(step_counts_jit, window_rows_jit)
def _flashinfer_kernel(triton, tl, live_count, SLOT_TOKENS, SLOT_DECODE_TOKENS, window_rows, **_):
    @triton.jit(do_not_specialize=["swa_bt_stride", "topk_stride", "cbt_stride", "td_static",
                                   "nt_static", "num_tokens", "topk_width", "ratio",
                                   "entries_per_page", "width"])
    def flashinfer_kernel(out, lens_out, slot_mapping, positions, token_to_req,
                          swa_block_table, swa_bt_stride, replay_start, topk, topk_stride, cbt,
                          cbt_stride, counts, td_static, nt_static, num_tokens, topk_width,
                          ratio, entries_per_page, width, WINDOW: tl.constexpr,
                          SWA_BLOCK: tl.constexpr, HAS_REPLAY: tl.constexpr,
                          HAS_TOPK: tl.constexpr, DEVICE_COUNTS: tl.constexpr,
                          ROWS: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr):
        t = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        in_rows = t < num_tokens
        td = live_count(counts, SLOT_DECODE_TOKENS, td_static, DEVICE_COUNTS)
        nt = live_count(counts, SLOT_TOKENS, nt_static, DEVICE_COUNTS)
        real = in_rows & (t < nt)
        decode = t < td
        valid = real & (tl.load(slot_mapping + t, mask=real, other=-1) >= 0)
        req = tl.load(token_to_req + t, mask=real, other=0).to(tl.int64)
        pos = tl.load(positions + t, mask=real, other=0).to(tl.int32)
        start = tl.maximum(pos - WINDOW + 1, 0)
        if HAS_REPLAY:
            rs = tl.load(replay_start + req, mask=valid & (t >= td), other=0)
            start = tl.maximum(start, rs)
        window_rows(out, width, lens_out, t, in_rows, valid, req, start,
                    tl.maximum(pos - start + 1, 0), swa_block_table, swa_bt_stride, WINDOW,
                    SWA_BLOCK, BLOCK_W, False, False)
        row = out + t.to(tl.int64)[:, None] * width
        extra = tl.zeros([ROWS], tl.int32)
        if HAS_TOPK:
            n_c = tl.where(ratio > 0, tl.maximum(pos + 1, 0) // tl.maximum(ratio, 1), 0)
            take = tl.where(decode, topk_width, tl.minimum(n_c, topk_width))
            take = tl.where(valid, take, 0)
            for c0 in range(0, width - WINDOW, BLOCK_K):
                c = c0 + tl.arange(0, BLOCK_K)[None, :]
                in_take = c < take[:, None]
                k = tl.load(topk + t.to(tl.int64)[:, None] * topk_stride + c, mask=in_take,
                            other=-1)
                ok = in_take & (k >= 0)
                entry = tl.where(ok, k, 0)
                page = tl.load(cbt + req[:, None] * cbt_stride + entry // entries_per_page,
                               mask=ok, other=0)
                value = tl.where(ok, page * entries_per_page + entry % entries_per_page, -1)
                tl.store(row + WINDOW + c, value,
                         mask=in_rows[:, None] & (c < width - WINDOW))
                extra += tl.sum(ok.to(tl.int32), axis=1)
            extra = tl.where(decode, extra, take)
        else:
            for c0 in range(0, width - WINDOW, BLOCK_K):
                c = c0 + tl.arange(0, BLOCK_K)[None, :]
                tl.store(row + WINDOW + c, tl.full([ROWS, BLOCK_K], -1, tl.int32),
                         mask=in_rows[:, None] & (c < width - WINDOW))
        tl.store(lens_out + t, tl.where(real, WINDOW + extra, 0), mask=in_rows)

    return flashinfer_kernel
