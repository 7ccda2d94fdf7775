"""The prefill-context-parallel split in three Triton kernels: what
:func:`~staticattn.builders.pcp.rank_rows.build_rows` computes with ~140 small torch ops (a
CUDA graph node each, a couple of microseconds apiece) in three launches.

1. **rows** (one program a rank): each request's row count on the rank, their running sums
   in the §2.2 order (decodes first, then prefills), and per row its request, offset,
   length and the rows' query starts. A row's request is the one whose rows
   ``[first_i, first_i + count_i)`` hold it: a one-hot match of a tile of rows against
   every request, since the requests' row ranges are disjoint. Also each request's first
   row on the rank and, for a replicated request, the rank that computes it: what the
   restore reads.
2. **tokens** (ranks x token tiles): each local token's row (a binary search in the rank's
   query starts), its global token, request, position and whether its copy is canonical.
3. **restore** (global token tiles): each global token's gathered index, from its request
   (a binary search in the global query starts) and the chunk its offset falls in.

Every output has its capacity shape and is written whole (pad values past the counts), so
the kernels are graph-safe and need nothing cleared first.
"""

from __future__ import annotations

import torch

from staticattn.kernels.runtime.compiled_launch import grid_size, launch, pow2_at_least
from staticattn.kernels.runtime.deferred import lazy_jit

__all__ = ["count_at_most_helper", "split_rows_triton"]

#: Local (or global) tokens a program of the token and restore kernels places.
TOKEN_TILE = 128
#: Row x request cells a program of the rows kernel matches at a time.
MATCH_CELLS = 8192


def split_rows_triton(qsl: torch.Tensor, pre: torch.Tensor, computed: torch.Tensor, out,
                      *, pcp_size: int, dcp_size: int) -> None:
    """Write :class:`~staticattn.builders.pcp.rank_rows.RowViews` ``out`` (every field,
    ``req_first_row`` and ``req_owner`` included) from the staged global batch.

    qsl : int32 ``(S + 1,)``; pre : bool or int32 ``(S,)`` (nonzero: still prefilling);
    computed : int32 ``(S,)``; contiguous, on ``out``'s device. ``S`` is at most
    ``out.req_owner.numel()``.
    """
    P, S = pcp_size, qsl.numel() - 1
    R, N = out.row_req.shape[1], out.token_to_global.shape[1]
    T, S_cap = out.hidden_restore_idx.numel(), out.req_owner.numel()
    block_s = pow2_at_least(S_cap)
    rows_tile = min(pow2_at_least(R), max(MATCH_CELLS // block_s, 8))
    launch(_rows_kernel(), (P,), qsl, pre, computed, out.row_req, out.row_offset,
           out.row_len, out.row_replicated, out.query_start_loc, out.num_rows,
           out.num_decode_rows, out.num_tokens, out.req_first_row, out.req_owner, S, S_cap,
           R, P=P, D=dcp_size, BLOCK_S=block_s, ROWS=rows_tile)
    launch(_tokens_kernel(), (P, grid_size(N, TOKEN_TILE)), qsl, computed, out.row_req,
           out.row_offset, out.row_replicated, out.query_start_loc, out.num_tokens,
           out.token_to_global, out.token_req, out.positions, out.write_mask, R, N,
           D=dcp_size, TOKENS=TOKEN_TILE, ROW_STEPS=R.bit_length())
    launch(_restore_kernel(), (grid_size(T, TOKEN_TILE),), qsl, out.req_first_row,
           out.req_owner, out.query_start_loc, out.hidden_restore_idx, S, S_cap, R, N, T,
           P=P, TOKENS=TOKEN_TILE, REQ_STEPS=S.bit_length())


@lazy_jit()
def count_at_most_helper(triton, tl, **_):
    @triton.jit
    def count_at_most(sorted_values, n, x, STEPS: tl.constexpr):
        """How many of ``sorted_values[0:n)`` (non-decreasing) are ``<= x``, per element
        of ``x``: a binary search of ``STEPS`` halvings (``STEPS >= bit_length(n)``)."""
        lo = tl.zeros_like(x)
        hi = tl.zeros_like(x) + n
        for _ in tl.static_range(STEPS):
            active = lo < hi
            mid = (lo + hi) // 2
            value = tl.load(sorted_values + mid, mask=active, other=0)
            right = active & (value <= x)
            lo = tl.where(right, mid + 1, lo)
            hi = tl.where(active & ~right, mid, hi)
        return lo

    return count_at_most


@lazy_jit()
def _rows_kernel(triton, tl, **_):
    @triton.jit
    def pcp_rows_kernel(qsl, pre, computed, row_req, row_offset, row_len, row_replicated,
                        row_qsl, num_rows, num_decode_rows, num_tokens, req_first_row,
                        req_owner, S, S_cap, R, P: tl.constexpr, D: tl.constexpr,
                        BLOCK_S: tl.constexpr, ROWS: tl.constexpr):
        p = tl.program_id(0)
        K = 2 * P
        i = tl.arange(0, BLOCK_S)
        real = i < S
        start = tl.load(qsl + i, mask=real, other=0)
        q = tl.load(qsl + i + 1, mask=real, other=0) - start
        prefilling = tl.load(pre + i, mask=real, other=0) != 0
        c = (q + K - 1) // K
        if D > 1:
            replicated = ~prefilling | ((K - 1) * c >= q)
        else:
            replicated = ~prefilling
        replicated = replicated & (q > 0)
        rep = replicated.to(tl.int32)
        ordinal = tl.cumsum(rep, 0) - rep
        split = (q - p * c > 0).to(tl.int32) + (q - (K - 1 - p) * c > 0).to(tl.int32)
        if D > 1:
            whole = rep
            owner = tl.zeros_like(q)
        else:
            whole = (replicated & (ordinal % P == p)).to(tl.int32)
            owner = ordinal % P
        count = tl.where(replicated, whole, split)
        decode = tl.where(prefilling, 0, count)
        prefill = tl.where(prefilling, count, 0)
        decodes = tl.sum(decode, 0)
        total = decodes + tl.sum(prefill, 0)
        first = tl.where(prefilling, decodes + tl.cumsum(prefill, 0) - prefill,
                         tl.cumsum(decode, 0) - decode)
        in_cap = i < S_cap
        tl.store(req_first_row + p * S_cap + i, tl.where(real, first, 0), mask=in_cap)
        # Rank 0's program writes the owners (a tensor mask: the interpreter takes no scalar).
        tl.store(req_owner + i, tl.where(replicated, owner, -1), mask=in_cap & (i * 0 + p == 0))
        # Rows, a tile at a time: each row's request by a one-hot match (requests' row
        # ranges are disjoint), the query starts as a running sum carried across tiles.
        carry = tl.sum(tl.zeros([ROWS], dtype=tl.int32), 0)
        tl.store(row_qsl + p * (R + 1), carry)
        for r0 in range(0, R, ROWS):
            r = r0 + tl.arange(0, ROWS)
            hit = ((first[None, :] <= r[:, None]) & (r[:, None] < first[None, :] + count[None, :])
                   & real[None, :])
            valid = r < total
            req = tl.sum(tl.where(hit, i[None, :], 0), 1)
            second = tl.sum(tl.where(hit, r[:, None] - first[None, :], 0), 1)
            row_rep = tl.sum(tl.where(hit, rep[None, :], 0), 1) > 0
            c_row = tl.sum(tl.where(hit, c[None, :], 0), 1)
            q_row = tl.sum(tl.where(hit, q[None, :], 0), 1)
            chunk = tl.where(second == 0, p, K - 1 - p)
            offset = tl.where(row_rep | ~valid, 0, chunk * c_row)
            # A row past the rank's matches no request: its lengths, hence its length, are 0.
            length = tl.where(row_rep, q_row, tl.maximum(tl.minimum(c_row, q_row - offset), 0))
            ends = carry + tl.cumsum(length, 0)
            in_r = r < R
            base = p * R + r
            tl.store(row_req + base, req, mask=in_r)
            tl.store(row_offset + base, offset, mask=in_r)
            tl.store(row_len + base, length, mask=in_r)
            tl.store(row_replicated + base, row_rep, mask=in_r)
            tl.store(row_qsl + p * (R + 1) + 1 + r, ends, mask=in_r)
            carry += tl.sum(length, 0)
        tl.store(num_rows + p, tl.maximum(total, 1))
        tl.store(num_decode_rows + p, decodes)
        tl.store(num_tokens + p, carry)

    return pcp_rows_kernel


@lazy_jit(count_at_most_helper)
def _tokens_kernel(triton, tl, count_at_most, **_):
    @triton.jit
    def pcp_tokens_kernel(qsl, computed, row_req, row_offset, row_replicated, row_qsl,
                          num_tokens, token_to_global, token_req, positions, write_mask,
                          R, N, D: tl.constexpr, TOKENS: tl.constexpr,
                          ROW_STEPS: tl.constexpr):
        p = tl.program_id(0)
        j = tl.program_id(1) * TOKENS + tl.arange(0, TOKENS)
        in_n = j < N
        real = j < tl.load(num_tokens + p)
        starts = row_qsl + p * (R + 1)
        # segment_of: the rows whose end is at most j, at most R - 1.
        row = tl.minimum(count_at_most(starts + 1, R, j, ROW_STEPS), R - 1)
        req = tl.load(row_req + p * R + row)
        within = j - tl.load(starts + row) + tl.load(row_offset + p * R + row)
        token = tl.load(qsl + req) + within
        position = tl.load(computed + req) + within
        if D > 1:
            # Under DCP every rank holds a replicated row; rank 0's copy is the canonical one.
            canonical = ~((tl.load(row_replicated + p * R + row) != 0) & (p != 0))
        else:
            canonical = in_n | ~in_n
        base = p * N + j
        tl.store(token_to_global + base, tl.where(real, token, 0), mask=in_n)
        tl.store(token_req + base, tl.where(real, req, 0), mask=in_n)
        tl.store(positions + base, tl.where(real, position, 0), mask=in_n)
        tl.store(write_mask + base, real & canonical, mask=in_n)

    return pcp_tokens_kernel


@lazy_jit(count_at_most_helper)
def _restore_kernel(triton, tl, count_at_most, **_):
    @triton.jit
    def pcp_restore_kernel(qsl, req_first_row, req_owner, row_qsl, hidden_restore_idx,
                           S, S_cap, R, N, T, P: tl.constexpr,
                           TOKENS: tl.constexpr, REQ_STEPS: tl.constexpr):
        K = 2 * P
        g = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
        in_t = g < T
        # segment_of(qsl, g): the request of global token g (past the step's: the last).
        i = tl.minimum(count_at_most(qsl + 1, S, g, REQ_STEPS), S - 1)
        start = tl.load(qsl + i)
        q = tl.load(qsl + i + 1) - start
        o = g - start
        c = (q + K - 1) // K
        chunk = o // tl.maximum(c, 1)
        owner = tl.load(req_owner + i)
        replicated = owner >= 0
        rank = tl.where(replicated, owner, tl.where(chunk < P, chunk, K - 1 - chunk))
        rank = tl.minimum(tl.maximum(rank, 0), P - 1)
        row = tl.load(req_first_row + rank * S_cap + i)
        row += (~replicated & (chunk >= P)).to(tl.int32)
        within = tl.where(replicated, o, o - chunk * c)
        index = rank * N + tl.load(row_qsl + rank * (R + 1) + tl.minimum(row, R)) + within
        tl.store(hidden_restore_idx + g, tl.where(g < tl.load(qsl + S), index, 0), mask=in_t)

    return pcp_restore_kernel
