"""One rank's share of the replicated decode rows under decode context parallelism
(``vllm-0.33-extras.md`` §7.2): the SWA window it attends and the dense entries it holds.

Both are derived from the single-GPU (dcp = 1) rows every rank builds; ownership is
``own_r(x) = (x // I) % world == r`` (the reference's V4 DCP uses ``I = 1``):

* **SWA window**: the dcp = 1 row of a decode token at ``p`` holds the slots of positions
  ``[s, p]`` in order, ``s = p - len + 1``. Rank ``r`` keeps the owned positions, ascending,
  as the same (global, the SWA cache is replicated) slots, compacted to the front, -1 after;
  ``len_r = local(p + 1) - local(s)``. Its ``j``-th entry is position
  ``x_j = global_index(local(s) + j)``, column ``x_j - s`` of the dcp = 1 row.
* **Dense entries**: of the ``n_c`` entries ``e < n_c`` (the dcp = 1 length), rank ``r``
  holds the owned ones, sharded by entry; its ``j``-th is its local entry ``j``, at the local
  slot ``bt[b, j // S] * S + j % S``; ``len_r = local(n_c)``, -1 after.

The ranks' rows partition the dcp = 1 row. Example (spec §7.2, ``W = 6``, ``bs = 4``, a
decode at ``p = 10`` whose dcp = 1 row is ``[85..90]``; world 2): rank 0 ``[86, 88, 90]``,
rank 1 ``[85, 87, 89]``.
"""

from __future__ import annotations

import torch

from staticattn.kernels.dcp.ownership import dcp_global_index, dcp_local_count, triton_dcp_helpers
from staticattn.kernels.runtime.compiled_launch import launch_rows
from staticattn.kernels.runtime.deferred import lazy_jit

__all__ = ["dense_rank_share", "swa_rank_share"]


def swa_rank_share(backend: str, rows: torch.Tensor, lens: torch.Tensor,
                   positions: torch.Tensor, out: torch.Tensor, lens_out: torch.Tensor, *,
                   num_rows: int, world: int, rank: int, interleave: int = 1) -> None:
    """The rank's SWA window of decode rows ``[0, num_rows)``.

    Parameters
    ----------
    rows : int32 device ``(>= num_rows, W)``, unit column stride
        The dcp = 1 rows (``decode_swa_indices`` flattened), -1 past their length.
    lens : int32 device ``(>= num_rows,)``
        Their lengths (0 for an invalid token).
    positions : int64 device ``(>= num_rows,)``
    out : int32 device ``(>= num_rows, W)``, unit column stride
    lens_out : int32 device ``(>= num_rows,)``
    num_rows : int
        Static extent.
    world, rank, interleave : int
        Token ownership.
    """
    if num_rows == 0:
        return
    width = rows.shape[1]
    if backend == "triton":
        launch_rows(_swa_kernel(), num_rows, width, rows, rows.stride(0), lens, positions,
                    out, out.stride(0), lens_out, num_rows, width, world, rank, interleave)
        return
    n = lens[:num_rows].long()
    p = positions[:num_rows].long()
    start = torch.where(n > 0, p - n + 1, 0)
    before = dcp_local_count(start, world, rank, interleave)
    held = torch.where(n > 0, dcp_local_count(p + 1, world, rank, interleave) - before, 0)
    j = torch.arange(width, device=rows.device)[None, :]
    column = dcp_global_index(before[:, None] + j, world, rank, interleave) - start[:, None]
    keep = j < held[:, None]
    value = rows[:num_rows].gather(1, torch.where(keep, column, 0).clamp(max=width - 1))
    out[:num_rows].copy_(torch.where(keep, value, -1))
    lens_out[:num_rows].copy_(held)


def dense_rank_share(backend: str, lens: torch.Tensor, token_to_req: torch.Tensor,
                     block_table: torch.Tensor, out: torch.Tensor, lens_out: torch.Tensor, *,
                     num_rows: int, entries_per_block: int, world: int, rank: int) -> None:
    """The rank's dense entries of decode rows ``[0, num_rows)`` (sharded by entry).

    Parameters
    ----------
    lens : int32 device ``(>= num_rows,)``
        ``n_c`` per row, the dcp = 1 length (``dense_decode_lens``; 0 for invalid tokens).
    token_to_req : int32 device ``(>= num_rows,)``
    block_table : int32 device ``(>= num_reqs, C)``, unit column stride
        The rank's table of its dense entries (``S`` local entries a page).
    out : int32 device ``(>= num_rows, M)``, unit column stride
        Local slots, -1 after ``len_r``; ``M >= cdiv(maxC, world)``.
    lens_out : int32 device ``(>= num_rows,)``
    num_rows, entries_per_block, world, rank : int
        Static extent, ``S``, the ranks.
    """
    if num_rows == 0:
        return
    width = out.shape[1]
    if backend == "triton":
        launch_rows(_dense_kernel(), num_rows, width, lens, token_to_req, block_table,
                    block_table.stride(0), block_table.shape[1], out, out.stride(0), lens_out,
                    num_rows, width, entries_per_block, world, rank)
        return
    held = dcp_local_count(lens[:num_rows].long(), world, rank, 1)
    j = torch.arange(width, device=out.device)[None, :]
    page = torch.div(j, entries_per_block, rounding_mode="floor")
    keep = (j < held[:, None]) & (page < block_table.shape[1])
    req = token_to_req[:num_rows].long()[:, None]
    block = block_table[req, torch.where(keep, page, 0)].long()
    out[:num_rows].copy_(torch.where(keep, block * entries_per_block + j % entries_per_block,
                                     -1))
    lens_out[:num_rows].copy_(keep.sum(dim=1))


@lazy_jit(triton_dcp_helpers)
def _swa_kernel(triton, tl, dcp_local_count_tl, dcp_global_index_tl, **_):
    @triton.jit
    def swa_rank_share_kernel(rows, rows_stride, lens, positions, out, out_stride, lens_out,
                              num_rows, width, world, rank, interleave,
                              ROWS: tl.constexpr, COLS: tl.constexpr):
        t = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        in_rows = t < num_rows
        n = tl.load(lens + t, mask=in_rows, other=0).to(tl.int64)
        p = tl.load(positions + t, mask=in_rows, other=0).to(tl.int64)
        start = tl.where(n > 0, p - n + 1, 0)
        before = dcp_local_count_tl(start, world, rank, interleave)
        held = tl.where(n > 0, dcp_local_count_tl(p + 1, world, rank, interleave) - before, 0)
        t64 = t.to(tl.int64)
        for c0 in range(0, width, COLS):
            j = c0 + tl.arange(0, COLS)
            cells = in_rows[:, None] & (j < width)[None, :]
            x = dcp_global_index_tl(before[:, None] + j[None, :], world, rank, interleave)
            keep = cells & (j[None, :] < held[:, None])
            value = tl.load(rows + t64[:, None] * rows_stride + (x - start[:, None]),
                            mask=keep, other=-1)
            tl.store(out + t64[:, None] * out_stride + j[None, :], value, mask=cells)
        tl.store(lens_out + t, held.to(tl.int32), mask=in_rows)

    return swa_rank_share_kernel


@lazy_jit(triton_dcp_helpers)
def _dense_kernel(triton, tl, dcp_local_count_tl, **_):
    @triton.jit
    def dense_rank_share_kernel(lens, token_to_req, table, table_stride, num_cols, out,
                                out_stride, lens_out, num_rows, width, entries, world, rank,
                                ROWS: tl.constexpr, COLS: tl.constexpr):
        t = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        in_rows = t < num_rows
        held = dcp_local_count_tl(tl.load(lens + t, mask=in_rows, other=0), world, rank, 1)
        req = tl.load(token_to_req + t, mask=in_rows, other=0).to(tl.int64)
        t64 = t.to(tl.int64)
        count = tl.zeros([ROWS], dtype=tl.int32)
        for c0 in range(0, width, COLS):
            j = c0 + tl.arange(0, COLS)
            cells = in_rows[:, None] & (j < width)[None, :]
            page = j // entries
            keep = cells & (j[None, :] < held[:, None]) & (page < num_cols)[None, :]
            block = tl.load(table + req[:, None] * table_stride + page[None, :], mask=keep,
                            other=0)
            slot = block.to(tl.int64) * entries + (j % entries)[None, :]
            tl.store(out + t64[:, None] * out_stride + j[None, :], tl.where(keep, slot, -1),
                     mask=cells)
            count += tl.sum(keep.to(tl.int32), axis=1)
        tl.store(lens_out + t, count, mask=in_rows)

    return dense_rank_share_kernel
