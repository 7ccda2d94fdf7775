"""The gather consumer's dense column for prefill tokens, chunk by chunk.

A prefill token's dense checksum is the sum of the dense cache over its complete compressed
entries, read through its row of local indices mapped to slots through its request's block
table (see :mod:`staticattn.consumers.emulated.gather`). The rows come a chunk at a time
(:class:`~staticattn.builders.swa.dense_prefill.DensePrefillChunks`): for each of the step's
static number of chunks, write the chunk into the workspace, then sum its rows -- two
launches, inside the step and its graph. Workspace row ``i`` of chunk ``c`` is the token
``Td + first_row(c) + i``; a row whose token is not a real token of the step adds nothing.
"""

from __future__ import annotations

import torch

from staticattn.consumers.emulated.gather_checksums import (
    GatherArgs,
    paged_sum_jit,
    torch_paged_sum,
)
from staticattn.kernels.runtime.compiled_launch import launch, pow2_at_least
from staticattn.kernels.runtime.deferred import lazy_jit
from staticattn.kernels.staging.stage_inputs import COUNT_DECODE_TOKENS, COUNT_TOKENS
from staticattn.kernels.staging.step_counts import step_counts_jit

__all__ = ["dense_prefill_checksums"]

#: The output column of the dense checksum.
DENSE_COLUMN = 1


def dense_prefill_checksums(backend: str, a: GatherArgs, out: torch.Tensor) -> None:
    """Write column 1 of the real prefill tokens' rows of ``out`` (int64 ``(num_tokens,
    columns)``, contiguous rows; column 1 of those rows 0 before, as
    :func:`~staticattn.consumers.emulated.gather_checksums.gather_checksums` leaves it),
    reading ``a.swa["dense_prefill"]`` chunk by chunk; nothing without it."""
    chunks = (a.swa or {}).get("dense_prefill")
    if chunks is None or not a.window_columns:
        return
    for c in range(chunks.num_chunks):
        indices, lens = chunks.write(c)
        first = chunks.first_row(c)
        if backend == "triton":
            _launch_triton(a, indices, lens, first, out)
        else:
            _torch(a, indices, lens, first, out)


def _torch(a: GatherArgs, indices, lens, first: int, out: torch.Tensor) -> None:
    counts = a.step_counts
    t = counts[COUNT_DECODE_TOKENS] + first + torch.arange(indices.shape[0], device=out.device)
    live = t < counts[COUNT_TOKENS]
    t = torch.where(live, t, 0)
    o = torch.arange(indices.shape[-1], device=out.device)
    keep = live[:, None] & (o < lens[:, None])
    sums = torch_paged_sum(a.caches[1], a.block_table, a.token_to_req[t].long(),
                     indices.long().clamp(min=0), a.dense_entries, keep)
    # Dead rows all land on token 0 and add 0; a live token's row is its only one.
    out[:, DENSE_COLUMN].index_add_(0, t, torch.where(live, sums, 0))


def _launch_triton(a: GatherArgs, indices, lens, first: int, out: torch.Tensor) -> None:
    width, cache = indices.shape[-1], a.caches[1]
    launch(_chunk_sums_kernel(), (indices.shape[0],),
           out, out.stride(0), a.token_to_req, a.block_table, a.block_table.stride(0),
           a.step_counts, indices, lens, cache, cache.shape[0], first, a.dense_entries,
           WIDTH=width, BLOCK_C=min(pow2_at_least(width, 16), 1024), COLUMN=DENSE_COLUMN)


@lazy_jit(paged_sum_jit, step_counts_jit)
def _chunk_sums_kernel(triton, tl, paged_sum, live_count, SLOT_TOKENS, SLOT_DECODE_TOKENS,
                       **_):
    # One compiled kernel for every chunk of a step: no specialisation on the first row.
    @triton.jit(do_not_specialize=["first_row"])
    def dense_prefill_sums_kernel(
        out, out_stride, token_to_req, bt, bt_stride, counts, indices, lens, cache,
        cache_size, first_row, entries, WIDTH: tl.constexpr, BLOCK_C: tl.constexpr,
        COLUMN: tl.constexpr,
    ):
        i = tl.program_id(0)
        t = live_count(counts, SLOT_DECODE_TOKENS, 0, True) + first_row + i
        live = t < live_count(counts, SLOT_TOKENS, 0, True)
        b = tl.load(token_to_req + t, mask=live, other=0).to(tl.int64)
        n = tl.load(lens + i, mask=live, other=0)
        total = tl.zeros([BLOCK_C], dtype=tl.int64)
        for c0 in range(0, n, BLOCK_C):
            o = c0 + tl.arange(0, BLOCK_C)
            keep = o < n
            local = tl.maximum(tl.load(indices + i.to(tl.int64) * WIDTH + o, mask=keep,
                                       other=0), 0)
            total += paged_sum(bt + b * bt_stride, local, keep, entries, cache, cache_size)
        tl.store(out + t.to(tl.int64) * out_stride + COLUMN, tl.sum(total, 0), mask=live)

    return dense_prefill_sums_kernel
