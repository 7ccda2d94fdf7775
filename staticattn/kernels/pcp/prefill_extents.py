"""One PCP rank's prefill-row KV extents in three Triton launches: what
:func:`~staticattn.builders.pcp.kv_plan.build_prefill_extents` computes with ~110 small
torch ops (PCP + DCP: the global chunk plan, the FlashMLA entries, the deinterleave).

1. **rows** (one program): each prefill row's extent, their running sums (global and the
   DCP shard's), the start of the region each row reads, each row's FlashMLA entry and
   each entry's first workspace row, the totals;
2. **tokens** (token tiles): each prefill query token's ``[ks, ke)`` and each local token's
   entry (-1 for decode tokens and padding);
3. **deinterleave** (workspace tiles): where each global entry of a region lies in the
   rank-major all-gather of the ranks' shards, and its region.

Every output is written whole (0, or -1 for the entries, past the counts): graph-safe.
"""

from __future__ import annotations

from staticattn.kernels.dcp.ownership import triton_dcp_helpers
from staticattn.kernels.pcp.split_rows import TOKEN_TILE, count_at_most_helper
from staticattn.kernels.runtime.compiled_launch import grid_size, launch, pow2_at_least
from staticattn.kernels.runtime.deferred import lazy_jit

__all__ = ["prefill_extents_triton"]


def prefill_extents_triton(rows, fields, out, rank: int, *, dcp_size: int, interleave: int,
                           ratio: int = 1) -> None:
    """Rank ``rank``'s :class:`~staticattn.builders.pcp.kv_plan.PrefillExtents` ``out`` from
    its rows (RowViews) and ``fields`` (RankFields) of the same batch; ``ratio``: entries
    of ``ratio`` tokens."""
    R, N, W = rows.row_req.shape[1], out.ks.numel(), out.deinterleave_idx.numel()
    launch(_rows_kernel(), (1,), rows.num_rows, rows.num_decode_rows, rows.num_tokens,
           fields.req_idx, fields.seq_lens, fields.dcp_local_seq_lens_upper,
           out.cu_seq_lens, out.local_cu_seq_lens, out.row_start_cu, out.row_entry,
           out.workspace_starts, out.totals, rank, R, ratio, D=dcp_size,
           BLOCK_R=pow2_at_least(R))
    launch(_tokens_kernel(), (grid_size(N, TOKEN_TILE),), rows.query_start_loc,
           rows.num_decode_rows, fields.start_pos, out.row_start_cu, out.row_entry, out.ks,
           out.ke, out.request_ids, rank, R, N, ratio, TOKENS=TOKEN_TILE,
           ROW_STEPS=R.bit_length())
    launch(_deinterleave_kernel(), (grid_size(W, TOKEN_TILE),), out.cu_seq_lens,
           out.local_cu_seq_lens, out.totals, out.deinterleave_idx, out.token_to_seq, R, W,
           interleave, D=dcp_size, TOKENS=TOKEN_TILE, ROW_STEPS=R.bit_length())


@lazy_jit()
def _running_max(triton, tl, **_):
    @triton.jit
    def running_max(a, b):
        return tl.maximum(a, b)

    return running_max


@lazy_jit(_running_max)
def _rows_kernel(triton, tl, running_max, **_):
    @triton.jit
    def pcp_extent_rows_kernel(num_rows, num_decode_rows, num_tokens, req_idx, seq_lens,
                               local_upper, cu_seq_lens, local_cu_seq_lens, row_start_cu,
                               row_entry, workspace_starts, totals, rank, R, ratio,
                               D: tl.constexpr, BLOCK_R: tl.constexpr):
        nd = tl.load(num_decode_rows + rank)
        n_pre = (tl.load(num_rows + rank) - nd) * (tl.load(num_tokens + rank) > 0)
        r = tl.arange(0, BLOCK_R)
        in_r = r < R
        src = tl.minimum(nd + r, R - 1)
        live = r < n_pre
        req = tl.load(req_idx + src, mask=in_r, other=0)
        before = tl.load(req_idx + tl.maximum(tl.minimum(nd + r - 1, R - 1), 0), mask=in_r,
                         other=0)
        request_first = live & ((r == 0) | (req != before))
        shard = tl.where(request_first, tl.load(local_upper + src, mask=in_r, other=0), 0)
        if D == 1:
            first = live
            extent = tl.where(live, tl.load(seq_lens + src, mask=in_r, other=0) // ratio, 0)
        else:
            first = request_first
            extent = shard
        global_ends = tl.cumsum(extent * D, 0)
        local_ends = tl.cumsum(extent, 0)
        total = tl.sum(extent * D, 0)
        local_total = tl.sum(extent, 0)
        tl.store(cu_seq_lens + r + 1, global_ends, mask=in_r)
        tl.store(local_cu_seq_lens + r + 1, local_ends, mask=in_r)
        tl.store(cu_seq_lens, total * 0)
        tl.store(local_cu_seq_lens, total * 0)
        # A row's region is its request's first row (PCP only: the row itself).
        region = tl.associative_scan(tl.where(first, r, 0), 0, running_max)
        entry = tl.cumsum(request_first.to(tl.int32), 0) - 1
        tl.store(row_entry + r, entry, mask=in_r)
        tl.store(workspace_starts + r, entry * 0, mask=in_r)
        tl.debug_barrier()  # the running sums and the zeros are stored: read and scatter
        start = tl.load(cu_seq_lens + region, mask=in_r & live, other=0)
        tl.store(row_start_cu + r, tl.where(live, start, total), mask=in_r)
        tl.store(row_start_cu + R, total)
        # Entry e's first workspace row: the shards of the entries before it.
        tl.store(workspace_starts + entry, tl.cumsum(shard, 0) - shard,
                 mask=in_r & request_first)
        tl.store(totals, total)
        tl.store(totals + 1, local_total)

    return pcp_extent_rows_kernel


@lazy_jit(count_at_most_helper)
def _tokens_kernel(triton, tl, count_at_most, **_):
    @triton.jit
    def pcp_extent_tokens_kernel(row_qsl, num_decode_rows, start_pos, row_start_cu, row_entry,
                                 ks, ke, request_ids, rank, R, N, ratio,
                                 TOKENS: tl.constexpr, ROW_STEPS: tl.constexpr):
        u = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
        in_n = u < N
        qsl = row_qsl + rank * (R + 1)
        nd = tl.load(num_decode_rows + rank)
        first_prefill = tl.load(qsl + nd)
        end = tl.load(qsl + R)
        # Prefill query token u is the rank's local token first_prefill + u.
        j = first_prefill + u
        row = tl.minimum(count_at_most(qsl + 1, R, j, ROW_STEPS), R - 1)
        real = j < end
        pos = tl.load(start_pos + row) + j - tl.load(qsl + row)
        k = tl.minimum(tl.maximum(row - nd, 0), R - 1)
        start = tl.where(real, tl.load(row_start_cu + k), 0)
        tl.store(ks + u, start, mask=in_n)
        tl.store(ke + u, tl.where(real, start + (pos + 1) // ratio, 0), mask=in_n)
        # Local token u's FlashMLA entry: its row's, for the prefill rows' tokens.
        own = tl.minimum(count_at_most(qsl + 1, R, u, ROW_STEPS), R - 1)
        entry = tl.load(row_entry + tl.minimum(tl.maximum(own - nd, 0), R - 1))
        tl.store(request_ids + u, tl.where((u >= first_prefill) & (u < end), entry, -1),
                 mask=in_n)

    return pcp_extent_tokens_kernel


@lazy_jit(triton_dcp_helpers, count_at_most_helper)
def _deinterleave_kernel(triton, tl, dcp_owner_tl, dcp_local_index_tl, count_at_most, **_):
    @triton.jit
    def pcp_deinterleave_kernel(cu_seq_lens, local_cu_seq_lens, totals, deinterleave_idx,
                                token_to_seq, R, W, interleave, D: tl.constexpr,
                                TOKENS: tl.constexpr, ROW_STEPS: tl.constexpr):
        t_abs = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
        in_w = t_abs < W
        region = tl.minimum(count_at_most(cu_seq_lens + 1, R, t_abs, ROW_STEPS), R - 1)
        t = t_abs - tl.load(cu_seq_lens + region)
        local_start = tl.load(local_cu_seq_lens + region)
        extent = tl.load(local_cu_seq_lens + region + 1) - local_start
        # Clamped into the request's shard: the tail past its length is never read.
        local = tl.minimum(dcp_local_index_tl(t, D, interleave), extent - 1)
        index = dcp_owner_tl(t, D, interleave) * tl.load(totals + 1) + local_start + local
        inside = t_abs < tl.load(totals)
        tl.store(deinterleave_idx + t_abs, tl.where(inside, index, 0), mask=in_w)
        tl.store(token_to_seq + t_abs, tl.where(inside, region, 0), mask=in_w)

    return pcp_deinterleave_kernel
