"""DeepSeek V4.1's compressor-ring links across PCP ranks in one Triton kernel: what
:func:`~staticattn.builders.pcp.ring_link.build_ring_links` computes with a sort, a search
and ~50 small torch ops.

Each gathered row's key is ``(ring_block << 32) | last_pos`` (-1 when empty). Instead of
sorting the ``P * R`` keys, each row compares its key with every other row's, a tile at a
time: it is its block's newest when no other row of the block has a larger key (or the
same key at a later index: the sort's stable order), and a row starting at an odd position
links to the first row (the smallest index, as the stable sort's search finds it) whose
key is ``(block, first_pos - 1)``. ``P * R`` is a few thousand rows at most, so the
comparisons cost less than the sort's launches.
"""

from __future__ import annotations

import torch

from staticattn.kernels.runtime.compiled_launch import grid_size, launch, pow2_at_least
from staticattn.kernels.runtime.deferred import lazy_jit

__all__ = ["ring_links_triton"]

#: Gathered rows a program links, and rows it compares them with at a time.
ROWS, COLS = 32, 128


def ring_links_triton(rows, num_computed: torch.Tensor, ring_table: torch.Tensor,
                      prev_row_indices: torch.Tensor, ring_write_slots: torch.Tensor,
                      ring_size: int) -> None:
    """Every rank's ``prev_row_indices`` int32 ``(P, R)`` and the ``ring_write_slots`` int64
    ``(P * R,)`` of ``rows`` (RowViews); ``num_computed`` int32 ``(S,)``; each request's
    ring block is column 0 of its row of ``ring_table`` int32 ``(S, W)``."""
    total = rows.row_req.numel()
    launch(_ring_kernel(), (grid_size(total, ROWS),), rows.row_req, rows.row_offset,
           rows.row_len, num_computed, ring_table, ring_table.stride(0), prev_row_indices,
           ring_write_slots, total, ring_size, ROWS=ROWS,
           COLS=min(COLS, pow2_at_least(total)))


@lazy_jit()
def _row_key(triton, tl, **_):
    @triton.jit
    def row_key(row_req, row_offset, row_len, num_computed, table, table_stride, g, valid):
        """``(key, first, block)`` of gathered rows ``g``: key -1 for an empty row."""
        req = tl.load(row_req + g, mask=valid, other=0)
        length = tl.load(row_len + g, mask=valid, other=0)
        first = (tl.load(num_computed + req, mask=valid, other=0)
                 + tl.load(row_offset + g, mask=valid, other=0)).to(tl.int64)
        block = tl.load(table + req.to(tl.int64) * table_stride, mask=valid,
                        other=0).to(tl.int64)
        key = tl.where(valid & (length > 0), (block << 32) | (first + length - 1), -1)
        return key, first, block

    return row_key


@lazy_jit(_row_key)
def _ring_kernel(triton, tl, row_key, **_):
    @triton.jit
    def pcp_ring_links_kernel(row_req, row_offset, row_len, num_computed, table,
                              table_stride, prev_row_indices, ring_write_slots, total,
                              ring_size, ROWS: tl.constexpr, COLS: tl.constexpr):
        g = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        mine = g < total
        key, first, block = row_key(row_req, row_offset, row_len, num_computed, table,
                                    table_stride, g, mine)
        target = (block << 32) | tl.maximum(first - 1, 0)
        newer = tl.zeros([ROWS], dtype=tl.int32)
        prev = tl.zeros([ROWS], dtype=tl.int32) + total
        for c0 in range(0, total, COLS):
            c = c0 + tl.arange(0, COLS)
            other, _, _ = row_key(row_req, row_offset, row_len, num_computed, table,
                                  table_stride, c, c < total)
            same = ((other[None, :] >> 32) == block[:, None]) & (other[None, :] >= 0)
            later = same & ((other[None, :] > key[:, None])
                            | ((other[None, :] == key[:, None]) & (c[None, :] > g[:, None])))
            newer += tl.sum(later.to(tl.int32), 1)
            match = other[None, :] == target[:, None]
            prev = tl.minimum(prev, tl.min(tl.where(match, c[None, :], total), 1))
        last = key & 0xFFFFFFFF
        write = (key >= 0) & (newer == 0) & (last % 2 == 0)
        tl.store(ring_write_slots + g, tl.where(write, block * ring_size + last % ring_size, -1),
                 mask=mine)
        linked = (key >= 0) & (first % 2 == 1) & (prev < total)
        tl.store(prev_row_indices + g, tl.where(linked, prev, -1), mask=mine)

    return pcp_ring_links_kernel
