"""One prefill-context-parallel rank's fields and input views in Triton: what
:func:`~staticattn.builders.pcp.rank_fields.build_rank_fields`,
:func:`~staticattn.builders.pcp.rank_fields.gathered_slots` and
:func:`~staticattn.builders.pcp.rank_step.write_local_inputs` compute with ~90 small torch
ops, in two launches and one a block table.

* **rank rows** (one program): per row of the rank its fields (start position, lengths,
  request state, the DCP shares of its lengths), the row views the builders read (query
  starts, sequence and query lengths) and the step counts;
* **gathered tokens** (token tiles over every rank's ``N``): each token's slot at its
  canonical copy when this DCP rank holds it, -1 elsewhere; the rank's own tokens also
  into the input views (positions, the token's local row, its slot);
* **table rows** (row tiles, a launch a table): each row's request's block row, the null
  block past the rows.

Each writes its outputs whole, so nothing needs clearing first (graph-safe).
"""

from __future__ import annotations

import torch

from staticattn.kernels.dcp.ownership import triton_dcp_helpers
from staticattn.kernels.pcp.split_rows import TOKEN_TILE, count_at_most_helper
from staticattn.kernels.runtime.compiled_launch import (
    grid_size,
    launch,
    launch_rows,
    pow2_at_least,
)
from staticattn.kernels.runtime.deferred import lazy_jit

__all__ = ["gathered_tokens_triton", "rank_rows_triton", "table_rows_triton"]

#: Rows of the rank a step of the rank-rows program writes.
ROW_TILE = 128


def rank_rows_triton(rows, fields, inputs, rank: int, dcp_rank: int, qsl: torch.Tensor,
                     pre: torch.Tensor, computed: torch.Tensor, states: torch.Tensor, *,
                     dcp_size: int, interleave: int) -> None:
    """Rank ``rank``'s :class:`~staticattn.builders.pcp.rank_fields.RankFields` ``fields``
    and the row views of ``inputs`` (``query_start_loc[:R + 1]``, ``seq_lens[:R]``,
    ``query_lens[:R]``, ``step_counts``) from ``rows`` (RowViews, written).

    qsl : int32 ``(S + 1,)``; pre, computed, states : int32 ``(S,)``: the staged batch.
    """
    R = rows.row_req.shape[1]
    launch(_rank_rows_kernel(), (1,), rows.row_req, rows.row_offset, rows.row_len,
           rows.query_start_loc, rows.num_rows, rows.num_decode_rows, rows.num_tokens, qsl,
           pre, computed, states, fields.start_pos, fields.seq_lens, fields.seq_lens_upper,
           fields.req_idx, fields.is_prefilling, fields.global_query_lens,
           fields.global_seq_lens_upper, fields.dcp_local_seq_lens,
           fields.dcp_local_seq_lens_upper, inputs.query_start_loc, inputs.seq_lens,
           inputs.query_lens, inputs.step_counts, rank, dcp_rank, R, dcp_size, interleave,
           ROWS=min(pow2_at_least(R + 1), ROW_TILE))


def gathered_tokens_triton(rows, block_table: torch.Tensor, gathered: torch.Tensor, inputs,
                           rank: int, dcp_rank: int, *, block_size: int, dcp_size: int,
                           interleave: int) -> None:
    """The gathered slot mapping of DCP rank ``dcp_rank`` into ``gathered`` int64
    ``(P * N,)`` (slots through ``block_table`` int32 ``(S, W)``, unit column stride, of
    ``block_size`` tokens a block), and rank ``rank``'s tokens into ``inputs``
    (``positions``, ``token_to_req``, ``slot_mapping``, each ``[:N]``)."""
    P, N = rows.token_to_global.shape
    R = rows.row_req.shape[1]
    launch(_gathered_tokens_kernel(), (P, grid_size(N, TOKEN_TILE)), rows.positions,
           rows.token_req, rows.write_mask, rows.query_start_loc, rows.num_tokens,
           block_table, block_table.stride(0), block_table.shape[1], gathered,
           inputs.positions, inputs.token_to_req, inputs.slot_mapping, rank, dcp_rank, R, N,
           block_size, interleave, D=dcp_size, TOKENS=TOKEN_TILE, ROW_STEPS=R.bit_length())


def table_rows_triton(rows, table: torch.Tensor, out: torch.Tensor, rank: int,
                      null_block: int) -> None:
    """Rank ``rank``'s rows of block table ``table`` int32 ``(S, W)`` into ``out`` int32
    ``(>= R, W)`` (both unit column stride): each row's request's row, ``null_block`` past
    the rank's rows."""
    R, width = rows.row_req.shape[1], table.shape[1]
    launch_rows(_table_rows_kernel(), R, width, rows.row_req, rows.num_rows, table,
                table.stride(0), out, out.stride(0), rank, R, width, null_block)


@lazy_jit(triton_dcp_helpers)
def _rank_rows_kernel(triton, tl, dcp_local_count_tl, **_):
    @triton.jit
    def pcp_rank_rows_kernel(row_req, row_offset, row_len, row_qsl, num_rows,
                             num_decode_rows, num_tokens, qsl, pre, computed, states,
                             start_pos, seq_lens, seq_lens_upper, req_idx, is_prefilling,
                             global_query_lens, global_seq_lens_upper, dcp_local_seq_lens,
                             dcp_local_seq_lens_upper, in_qsl, in_seq_lens, in_query_lens,
                             step_counts, rank, dcp_rank, R, D, interleave,
                             ROWS: tl.constexpr):
        held_rows = tl.load(num_rows + rank)
        for r0 in range(0, R + 1, ROWS):
            r = r0 + tl.arange(0, ROWS)
            tl.store(in_qsl + r, tl.load(row_qsl + rank * (R + 1) + r, mask=r <= R),
                     mask=r <= R)
            in_r = r < R
            held = in_r & (r < held_rows)
            req = tl.load(row_req + rank * R + r, mask=in_r, other=0)
            offset = tl.load(row_offset + rank * R + r, mask=in_r, other=0)
            length = tl.load(row_len + rank * R + r, mask=in_r, other=0)
            q = tl.load(qsl + req + 1) - tl.load(qsl + req)
            done = tl.load(computed + req)
            start = done + offset
            seq_len = tl.where(length > 0, start + length, 0)
            total = done + q
            zero = tl.zeros_like(r)
            # The fields and the input views are the rank's own: indexed by its row r.
            tl.store(start_pos + r, tl.where(held, start, zero), mask=in_r)
            tl.store(seq_lens + r, tl.where(held, seq_len, zero), mask=in_r)
            tl.store(in_seq_lens + r, tl.where(held, seq_len, zero), mask=in_r)
            tl.store(seq_lens_upper + r, tl.where(held, start + length, zero), mask=in_r)
            tl.store(req_idx + r, tl.where(held, tl.load(states + req), zero), mask=in_r)
            tl.store(is_prefilling + r, held & (tl.load(pre + req) != 0), mask=in_r)
            tl.store(global_query_lens + r, tl.where(held, q, zero), mask=in_r)
            tl.store(global_seq_lens_upper + r, tl.where(held, total, zero), mask=in_r)
            tl.store(dcp_local_seq_lens + r, tl.where(
                held, dcp_local_count_tl(seq_len, D, dcp_rank, interleave), zero), mask=in_r)
            tl.store(dcp_local_seq_lens_upper + r, tl.where(
                held, dcp_local_count_tl(total, D, 0, interleave), zero), mask=in_r)
            tl.store(in_query_lens + r, length, mask=in_r)
        decodes = tl.load(num_decode_rows + rank)
        tl.store(step_counts, held_rows)
        tl.store(step_counts + 1, tl.load(num_tokens + rank))
        tl.store(step_counts + 2, decodes)
        tl.store(step_counts + 3, tl.load(row_qsl + rank * (R + 1) + decodes))

    return pcp_rank_rows_kernel


@lazy_jit(triton_dcp_helpers, count_at_most_helper)
def _gathered_tokens_kernel(triton, tl, dcp_owner_tl, dcp_local_index_tl, count_at_most,
                            **_):
    @triton.jit
    def pcp_gathered_tokens_kernel(positions, token_req, write_mask, row_qsl, num_tokens,
                                   table, table_stride, num_cols, gathered, in_positions,
                                   in_token_to_req, in_slot_mapping, rank, dcp_rank, R, N,
                                   block_size, interleave, D: tl.constexpr,
                                   TOKENS: tl.constexpr, ROW_STEPS: tl.constexpr):
        p = tl.program_id(0)
        j = tl.program_id(1) * TOKENS + tl.arange(0, TOKENS)
        in_n = j < N
        t = p * N + j
        pos = tl.load(positions + t, mask=in_n, other=0).to(tl.int64)
        req = tl.load(token_req + t, mask=in_n, other=0).to(tl.int64)
        mine = tl.load(write_mask + t, mask=in_n, other=0) != 0
        span = block_size * D
        column = tl.minimum(pos // span, num_cols - 1)
        block = tl.load(table + req * table_stride + column, mask=in_n, other=0).to(tl.int64)
        inner = pos % span
        if D > 1:
            mine = mine & (dcp_owner_tl(inner, D, interleave) == dcp_rank)
            inner = dcp_local_index_tl(inner, D, interleave)
        slot = tl.where(mine, block * block_size + inner, -1)
        tl.store(gathered + t, slot, mask=in_n)
        own = in_n & (j * 0 + p == rank)
        starts = row_qsl + rank * (R + 1)
        row = tl.minimum(count_at_most(starts + 1, R, j, ROW_STEPS), R - 1)
        tl.store(in_positions + j, pos, mask=own)
        tl.store(in_token_to_req + j, tl.where(j < tl.load(num_tokens + rank), row, 0),
                 mask=own)
        tl.store(in_slot_mapping + j, slot, mask=own)

    return pcp_gathered_tokens_kernel


@lazy_jit()
def _table_rows_kernel(triton, tl, **_):
    @triton.jit
    def pcp_table_rows_kernel(row_req, num_rows, table, table_stride, out, out_stride, rank,
                              R, width, null_block, ROWS: tl.constexpr, COLS: tl.constexpr):
        r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        in_r = r < R
        held = in_r & (r < tl.load(num_rows + rank))
        req = tl.load(row_req + rank * R + r, mask=in_r, other=0).to(tl.int64)
        r64 = r.to(tl.int64)
        for c0 in range(0, width, COLS):
            c = c0 + tl.arange(0, COLS)
            cells = in_r[:, None] & (c < width)[None, :]
            value = tl.load(table + req[:, None] * table_stride + c[None, :],
                            mask=cells & held[:, None], other=null_block)
            tl.store(out + r64[:, None] * out_stride + c[None, :], value, mask=cells)

    return pcp_table_rows_kernel
