"""The one Triton helper that writes sliding-window rows, shared by the SWA kernels (decode
and paged prefill rows, FlashInfer rows, DSpark draft rows)."""

from __future__ import annotations

from staticattn.kernels.runtime.deferred import lazy_jit

__all__ = ["span_reach_jit", "window_rows_jit"]


@lazy_jit()
def window_rows_jit(triton, tl):
    """The ``@triton.jit`` helper ``window_rows`` (defined on first use; a kernel takes it
    by naming this function in its :func:`~staticattn.kernels.runtime.deferred.lazy_jit`)."""

    @triton.jit
    def window_rows(indices, row_stride, lens, rows, row_mask, live, req, start, n,
                    swa_block_table, swa_bt_stride, WIDTH: tl.constexpr,
                    SWA_BLOCK: tl.constexpr, BLOCK_W: tl.constexpr, STORE_LENS: tl.constexpr,
                    INCREMENTAL: tl.constexpr):
        """Rows ``rows`` (masked by ``row_mask``, ``row_stride`` apart), columns ``[0,
        WIDTH)``: the flat SWA slots of positions ``start .. start + n - 1`` of request
        ``req``, then -1; where not ``live`` a row of -1. With ``STORE_LENS`` the length
        too (``n``, 0 where not ``live``). ``INCREMENTAL`` (with ``STORE_LENS``): a row's
        entries at or past its stored length are -1 already (every writer keeps them so, from
        the buffer's fill on), so only the columns below the longer of the old and the new
        length are written: the cost follows the step's windows, not the buffer's rows."""
        n = tl.where(live, n, 0)
        o = tl.arange(0, BLOCK_W)
        reach = tl.zeros_like(n) + WIDTH
        if INCREMENTAL:
            reach = tl.maximum(n, tl.load(lens + rows, mask=row_mask, other=0))
            # Every warp holds a copy of ``rows`` and loads the old length itself; without
            # the barrier a late warp can read the length an early warp already replaced and
            # leave its columns between the new and the old length uncleared.
            tl.debug_barrier()
        if STORE_LENS:
            tl.store(lens + rows, n, mask=row_mask)
        keep = o[None, :] < n[:, None]
        # Masked entries are 0, so // and % (truncating in Triton) see no negatives.
        p = tl.where(keep, start[:, None] + o[None, :], 0)
        blk = tl.load(swa_block_table + req[:, None] * swa_bt_stride + p // SWA_BLOCK,
                      mask=keep, other=0)
        tl.store(indices + rows.to(tl.int64)[:, None] * row_stride + o[None, :],
                 tl.where(keep, blk * SWA_BLOCK + p % SWA_BLOCK, -1),
                 mask=row_mask[:, None] & (o[None, :] < WIDTH) & (o[None, :] < reach[:, None]))

    return window_rows


@lazy_jit()
def span_reach_jit(triton, tl):
    """The ``@triton.jit`` helper ``span_reach``: ``(left, right)`` of tokens in image spans
    (``vllm-0.33-extras.md`` §3.3; taken like :func:`window_rows_jit`)."""

    @triton.jit
    def span_reach(spans, req, pos, live, MIT: tl.constexpr, NUM_SPANS: tl.constexpr,
                   BLOCK_S: tl.constexpr):
        """For tokens ``(req, pos)`` (vectors; ``live`` masks them): ``left = min(pos -
        first, MIT - 1)`` and ``right = min(last - pos, MIT)`` of the span ``(req, first,
        last)`` of ``spans`` (int32 ``(NUM_SPANS, 3)``; unused rows request -1) holding the
        token, 0 and 0 outside every span. Spans of a request do not overlap (the host
        checks), so at most one holds a token and a max picks it."""
        s = tl.arange(0, BLOCK_S)
        used = s < NUM_SPANS
        owner = tl.load(spans + s * 3, mask=used, other=-1)
        first = tl.load(spans + s * 3 + 1, mask=used, other=0)
        last = tl.load(spans + s * 3 + 2, mask=used, other=-1)
        inside = (live[:, None] & (owner[None, :] == req[:, None])
                  & (first[None, :] <= pos[:, None]) & (pos[:, None] <= last[None, :]))
        left = tl.max(tl.where(inside, tl.minimum(pos[:, None] - first[None, :], MIT - 1), 0),
                      axis=1)
        right = tl.max(tl.where(inside, tl.minimum(last[None, :] - pos[:, None], MIT), 0),
                       axis=1)
        return left, right

    return span_reach
