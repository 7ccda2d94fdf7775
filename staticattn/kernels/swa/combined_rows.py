"""Prefill combined rows in workspace coordinates (``docs/spec/deepseek-v41.md`` §7.2,
``vllm-0.33-extras.md`` §5.1 without images): one row per prefill token, the layer's top-k
compressed entries first, then its sliding window, as rows of the chunk's workspace.

The workspace of a chunk ``(s, e, N, M)`` of the prefill chunk plan
(:mod:`.prefill_gather`) holds, for its ``i``-th request, ``M`` rows: ``[0, N)`` the request's
compressed entries, ``[N, N + gather_len)`` its last ``gather_len`` SWA tokens (positions
``gather_start = L - gather_len`` on). For prefill row ``r`` (token ``t = Td + r`` at
position ``p`` of request ``D + j``, ``j`` in chunk ``(s, e, N, M)``, ``i = j - s``):

* ``topk_len = min(n_c(p), K)`` with ``n_c(p) = (p + 1) // R`` (0 for ``R = 0``), taken from
  the position, not from the indices;
* columns ``[0, topk_len)``: ``k + M i`` for the top-k entry ``k = topk[t, c]`` if
  ``0 <= k < N``, else -1 (for a type reading every entry, ``k = c``);
* ``swa_start = max(p - W + 1, gather_start)``, ``swa_len = p - swa_start + 1``; columns
  ``[topk_len, topk_len + swa_len)``: ``M i + N + (swa_start - gather_start) + o``; inside
  an image span (``vllm-0.33-extras.md`` §5.1, §3.4) ``p - W + 1`` becomes ``p - max(W - 1,
  left)`` and the window ends at ``p + right``;
* the rest -1; ``combined_len = topk_len + swa_len``.

Rows past the real prefill tokens: -1 and length 0. Example (deepseek-v41.md §11 case 4,
W = 4, R = 2, K = 4, one request L = 12, q = 8 replayed from 4: gather_len 8, plan ``N = 6,
M = 17``), top-k row ``[0, 1, -1, -1]``: p = 4 -> ``[0, 1, 6]`` (two cached compressed
entries, one window slot), length 3.

Difference from the reference's V4 kernel: a -1 entry inside ``topk_len`` stays -1 here;
V4's adds ``M i`` to it unconditionally, which for ``i >= 1`` names another request's
workspace row (``M i - 1``). V4.1's kernel tests the range, as here.
"""

from __future__ import annotations

import torch

from staticattn.kernels.runtime.backend import triton_interpreted
from staticattn.kernels.runtime.compiled_launch import grid_size, launch, pow2_at_least
from staticattn.kernels.runtime.deferred import lazy_jit
from staticattn.kernels.staging.stage_inputs import COUNT_DECODE_TOKENS, COUNT_DECODES, COUNT_TOKENS
from staticattn.kernels.staging.step_counts import step_counts_jit
from staticattn.kernels.swa.swa_rows_torch import span_reach as span_reach_torch
from staticattn.kernels.swa.swa_rows_torch import window_start
from staticattn.kernels.swa.window import span_reach_jit

__all__ = ["prefill_combined_rows"]


def prefill_combined_rows(
    backend: str,
    out: torch.Tensor,
    lens_out: torch.Tensor,
    positions: torch.Tensor,
    token_to_req: torch.Tensor,
    seq_lens: torch.Tensor,
    gather_lens: torch.Tensor,
    chunks: torch.Tensor,
    num_chunks: torch.Tensor,
    topk: torch.Tensor | None,
    *,
    ratio: int,
    topk_width: int,
    window: int,
    num_tokens: int,
    counts: tuple[int, int, int] | torch.Tensor,
    image_spans: torch.Tensor | None = None,
    max_image_tokens: int = 0,
) -> None:
    """Write the combined rows of the prefill tokens (see the module docstring).

    Parameters
    ----------
    out : int32 ``(>= num_tokens, width)``, contiguous rows; ``width >= topk_width + W``
    lens_out : int32 ``(>= num_tokens,)``
    positions : int64 ``(>= num_tokens,)``;  token_to_req : int32 ``(>= num_tokens,)``
    seq_lens : int32 ``(num_reqs,)``
    gather_lens : int32 ``(>= prefills,)``, row ``j`` = request ``D + j``
    chunks : int32 ``(C, 4)`` contiguous, the plan's ``(s, e, N, M)`` rows;
    num_chunks : int32 ``(1,)``
    topk : int32 ``(>= num_tokens, >= topk_width)`` or None
        The layer's top-k rows by token (local compressed indices, -1 padded); None: the
        type reads every entry (``k = c``) or none (``topk_width = 0``).
    ratio : int
        ``R`` (0: no compressed entries).
    topk_width : int
        ``K``: the top-k columns a row may take.
    num_tokens : int
        Static extent: rows ``[0, num_tokens)`` are written.
    counts : ``(D, Td, nt)`` static ints, or the staging's ``step_counts`` (int32 device
        ``(4,)``).
    image_spans : int32 ``(S, 3)`` or None;  max_image_tokens : int
        Image spans (``vllm-0.33-extras.md`` §5.1 with §3.4): a token's window becomes
        ``[max(p - max(W - 1, left), 0), p + right]`` (then clamped at the gather start).
    """
    if num_tokens == 0:
        return
    device_counts = isinstance(counts, torch.Tensor)
    if backend == "triton":
        d, td, nt = (0, 0, 0) if device_counts else counts
        topk_ptr = topk if topk is not None else lens_out
        rows = 32 if triton_interpreted() else 4
        launch(_combined_kernel(), (grid_size(num_tokens, rows),),
            out, lens_out, positions, token_to_req, seq_lens, gather_lens, chunks,
            num_chunks, topk_ptr, topk_ptr.stride(0) if topk is not None else 0,
            counts if device_counts else lens_out, d, td, nt, num_tokens, chunks.shape[0],
            ratio, topk_width, window, out.shape[1],
            lens_out if image_spans is None else image_spans,
            DEVICE_COUNTS=device_counts, HAS_TOPK=topk is not None,
            MIT=max(max_image_tokens, 1),
            NUM_SPANS=0 if image_spans is None else image_spans.shape[0],
            BLOCK_S=pow2_at_least(1 if image_spans is None else image_spans.shape[0], 16),
            ROWS=rows, BLOCK_C=128, BLOCK_CH=128,
        )
        return
    _combined_torch(out, lens_out, positions, token_to_req, seq_lens, gather_lens, chunks,
                    num_chunks, topk, ratio, topk_width, window, num_tokens, counts,
                    image_spans, max_image_tokens)


def _combined_torch(out, lens_out, positions, token_to_req, seq_lens, gather_lens, chunks,
                    num_chunks, topk, ratio, topk_width, window, num_tokens, counts,
                    image_spans, max_image_tokens) -> None:
    dev = positions.device
    if isinstance(counts, torch.Tensor):
        d, td, nt = (counts[COUNT_DECODES], counts[COUNT_DECODE_TOKENS], counts[COUNT_TOKENS])
    else:
        d, td, nt = (torch.full((), c, device=dev) for c in counts)
    r = torch.arange(num_tokens, device=dev)
    live = td + r < nt
    t = torch.where(live, td + r, 0)
    req = token_to_req[t].long()
    j = (req - d).clamp(min=0)
    c_idx = torch.arange(chunks.shape[0], device=dev)
    ends = torch.where(c_idx < num_chunks, chunks[:, 1], torch.iinfo(torch.int32).max)
    chunk = (ends[None, :] <= j[:, None]).sum(1).clamp(max=chunks.shape[0] - 1)
    start, n, m = chunks[chunk, 0], chunks[chunk, 2], chunks[chunk, 3]
    i = j - start
    gather_start = seq_lens[req] - gather_lens[j]
    pos = positions[t].long()
    n_c = (pos + 1).clamp(min=0) // ratio if ratio else torch.zeros_like(pos)
    topk_len = torch.where(live, n_c.clamp(max=topk_width), 0)
    reach = None if image_spans is None else tuple(x[:, 0] for x in span_reach_torch(
        image_spans, req[:, None], pos[:, None], max_image_tokens))
    swa_start, swa_len = window_start(pos, window, gather_start, reach)
    swa_len = torch.where(live, swa_len, 0)
    col = torch.arange(out.shape[1], device=dev)[None, :]
    if topk is None:
        k = col.expand(num_tokens, -1)
    else:
        k = topk[t, : min(topk_width, out.shape[1])].long()
        k = torch.nn.functional.pad(k, (0, out.shape[1] - k.shape[1]), value=-1)
    in_topk = col < topk_len[:, None]
    topk_value = torch.where((k >= 0) & (k < n[:, None]), k + (m * i)[:, None], -1)
    o = col - topk_len[:, None]
    in_window = (o >= 0) & (o < swa_len[:, None])
    window_value = (m * i + n + (swa_start - gather_start))[:, None] + o
    rows = torch.where(in_topk, topk_value, torch.where(in_window, window_value, -1))
    out[:num_tokens].copy_(rows)
    lens_out[:num_tokens].copy_(topk_len + swa_len)


@lazy_jit(step_counts_jit, span_reach_jit)
def _combined_kernel(triton, tl, live_count, SLOT_TOKENS, SLOT_DECODES, SLOT_DECODE_TOKENS,
                     span_reach, **_):
    @triton.jit(do_not_specialize=["topk_stride", "d_static", "td_static", "nt_static",
                                   "num_tokens", "max_chunks", "ratio", "topk_width", "window",
                                   "width"])
    def combined_kernel(out, lens_out, positions, token_to_req, seq_lens, gather_lens, chunks,
                        num_chunks, topk, topk_stride, counts, d_static, td_static, nt_static,
                        num_tokens, max_chunks, ratio, topk_width, window, width, spans,
                        DEVICE_COUNTS: tl.constexpr, HAS_TOPK: tl.constexpr,
                        MIT: tl.constexpr, NUM_SPANS: tl.constexpr, BLOCK_S: tl.constexpr,
                        ROWS: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_CH: tl.constexpr):
        r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        in_rows = r < num_tokens
        d = live_count(counts, SLOT_DECODES, d_static, DEVICE_COUNTS)
        td = live_count(counts, SLOT_DECODE_TOKENS, td_static, DEVICE_COUNTS)
        nt = live_count(counts, SLOT_TOKENS, nt_static, DEVICE_COUNTS)
        live = in_rows & (td + r < nt)
        t = tl.where(live, td + r, 0)
        req = tl.load(token_to_req + t, mask=live, other=0)
        j = tl.maximum(req - d, 0)
        # The chunk holding request j: the chunks whose end is at or before j.
        nc = tl.load(num_chunks)
        chunk = tl.zeros([ROWS], tl.int32)
        for c0 in range(0, max_chunks, BLOCK_CH):
            c = c0 + tl.arange(0, BLOCK_CH)
            ends = tl.load(chunks + c * 4 + 1, mask=c < nc, other=2147483647)
            chunk += tl.sum((ends[None, :] <= j[:, None]).to(tl.int32), axis=1)
        chunk = tl.minimum(chunk, max_chunks - 1)
        start = tl.load(chunks + chunk * 4, mask=live, other=0)
        n = tl.load(chunks + chunk * 4 + 2, mask=live, other=0)
        m = tl.load(chunks + chunk * 4 + 3, mask=live, other=0)
        i = j - start
        gather_start = (tl.load(seq_lens + req, mask=live, other=0)
                        - tl.load(gather_lens + j, mask=live, other=0))
        pos = tl.load(positions + t, mask=live, other=0).to(tl.int32)
        n_c = tl.where(ratio > 0, tl.maximum(pos + 1, 0) // tl.maximum(ratio, 1), 0)
        topk_len = tl.where(live, tl.minimum(n_c, topk_width), 0)
        behind = tl.zeros_like(pos) + (window - 1)
        ahead = tl.zeros_like(pos)
        if NUM_SPANS > 0:  # image spans widen the window (vllm-0.33-extras.md §3.4)
            left, ahead = span_reach(spans, req, pos, live, MIT, NUM_SPANS, BLOCK_S)
            behind = tl.maximum(behind, left)
        swa_start = tl.maximum(tl.maximum(pos - behind, 0), gather_start)
        swa_len = tl.where(live, tl.maximum(pos + ahead - swa_start + 1, 0), 0)
        tl.store(lens_out + r, topk_len + swa_len, mask=in_rows)
        base = m * i
        for c0 in range(0, width, BLOCK_C):
            col = c0 + tl.arange(0, BLOCK_C)[None, :]
            in_topk = col < topk_len[:, None]
            if HAS_TOPK:
                k = tl.load(topk + t.to(tl.int64)[:, None] * topk_stride + col, mask=in_topk,
                            other=-1)
            else:
                k = col + r[:, None] * 0
            topk_value = tl.where((k >= 0) & (k < n[:, None]), k + base[:, None], -1)
            o = col - topk_len[:, None]
            in_window = (o >= 0) & (o < swa_len[:, None])
            window_value = (base + n + (swa_start - gather_start))[:, None] + o
            value = tl.where(in_topk, topk_value, tl.where(in_window, window_value, -1))
            tl.store(out + r.to(tl.int64)[:, None] * width + col, value,
                     mask=in_rows[:, None] & (col < width))

    return combined_kernel
