"""The one Triton helper that writes the rows of the type that reads every compressed entry
(C128A): the decode rows in global slots (:mod:`.swa_rows`) and the prefill rows in local
indices, a chunk at a time (:mod:`.dense_prefill_rows`)."""

from __future__ import annotations

from staticattn.kernels.runtime.deferred import lazy_jit

__all__ = ["dense_rows_jit"]


@lazy_jit()
def dense_rows_jit(triton, tl):
    """The ``@triton.jit`` helper ``dense_rows`` (defined on first use; a kernel takes it by
    naming this function in its :func:`~staticattn.kernels.runtime.deferred.lazy_jit`)."""

    @triton.jit
    def dense_rows(indices, lens, rows, live_mask, n_new, block_table, bt_stride, req,
                   LOCAL: tl.constexpr, WIDTH: tl.constexpr, ENTRIES: tl.constexpr,
                   BLOCK_C: tl.constexpr):
        """Write rows ``rows`` (masked by ``live_mask``, ``WIDTH`` apart) to ``n_new``
        entries: global slots through the block table, or local indices ``0 .. n_new - 1``
        (``LOCAL``); then -1 up to the old length, and the new length. A row's entries at or
        past its stored length are -1 already (every writer keeps them so, from the buffer's
        fill on), so only the columns below the longer of the two lengths are written: the
        cost follows the step's contexts, not ``maxC``."""
        n_old = tl.load(lens + rows, mask=live_mask, other=0)
        # Every warp loads the old lengths before any warp stores the new ones (a late warp
        # would otherwise read a new length and skip clearing the old row's tail).
        tl.debug_barrier()
        reach = tl.max(tl.where(live_mask, tl.maximum(n_new, n_old), 0), axis=0)
        for c0 in range(0, reach, BLOCK_C):
            e = c0 + tl.arange(0, BLOCK_C)
            keep = e[None, :] < n_new[:, None]
            if LOCAL:
                value = tl.where(keep, e[None, :], -1)
            else:
                blk = tl.load(block_table + req[:, None] * bt_stride + e[None, :] // ENTRIES,
                              mask=keep, other=0)
                value = tl.where(keep, blk * ENTRIES + e[None, :] % ENTRIES, -1)
            reach_row = tl.maximum(n_new, n_old)
            tl.store(indices + rows.to(tl.int64)[:, None] * WIDTH + e[None, :], value,
                     mask=live_mask[:, None] & (e[None, :] < reach_row[:, None]))
        tl.store(lens + rows, n_new, mask=live_mask)

    return dense_rows
