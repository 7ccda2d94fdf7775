"""One chunk of the dense type's prefill rows (C128A's local top-k), into a fixed workspace.

The reference keeps one ``maxC``-wide row per prefill token of a step (its
``c128a_prefill_topk_indices``, ``(T, maxC)`` int32: 256 MiB at a 1M context and 8,192
tokens). Here the rows of ``Rc`` consecutive prefill tokens at a time go to a workspace of
``Rc`` rows, and the reader walks the step's prefill tokens chunk by chunk: chunk ``c`` holds
prefill rows ``[c Rc, (c + 1) Rc)``, the tokens ``Td + c Rc + i``.

Workspace row ``i`` of the launch for ``first_row`` holds prefill row ``first_row + i``, the
token ``t = Td + first_row + i`` at position ``p``: the local indices ``o < n_c = min((p +
1) // R, maxC)``, then -1, and its length ``n_c`` -- today's row for that token
(``vllm-0.33-extras.md`` §5.2, ``vllm-semantics.md`` §7). A row whose token is not a real
token of the step (``t >= nt``) holds -1 and length 0, so a chunk past the step's prefill
tokens holds nothing. ``Td`` and ``nt`` are static ints, or read from the staging's
``step_counts`` on the device (a graph of any composition). Example (R = 128): prefill
tokens at positions ``[255, 256, 383]``, ``Rc = 2``: chunk 0 ``[0, 1, -1 ...] (2),
[0, 1, -1 ...] (2)``; chunk 1 ``[0, 1, 2, -1 ...] (3), [-1 ...] (0)``.

The Triton kernel writes a row only below the longer of its new and its old length (the rest
is -1 already, :func:`~staticattn.kernels.swa.dense_rows.dense_rows_jit`), so a chunk costs
its tokens' contexts and an empty chunk reads and writes its lengths only. The torch version
writes whole rows.
"""

from __future__ import annotations

import torch

from staticattn.kernels.runtime.backend import triton_interpreted
from staticattn.kernels.runtime.compiled_launch import grid_size, launch, pow2_at_least
from staticattn.kernels.runtime.deferred import lazy_jit
from staticattn.kernels.staging.stage_inputs import COUNT_DECODE_TOKENS, COUNT_TOKENS
from staticattn.kernels.staging.step_counts import step_counts_jit
from staticattn.kernels.swa.dense_rows import dense_rows_jit
from staticattn.kernels.swa.swa_rows_torch import complete_groups

__all__ = ["build_dense_prefill_chunk"]


def build_dense_prefill_chunk(
    backend: str,
    indices: torch.Tensor,
    lens: torch.Tensor,
    positions: torch.Tensor,
    ratio: int,
    first_row: int,
    num_rows: int,
    num_tokens: int,
    num_decode_tokens: int,
    step_counts: torch.Tensor | None = None,
    block_tokens: int | None = None,
) -> None:
    """Write workspace rows ``[0, num_rows)``: prefill rows ``first_row ..`` of the step.

    Parameters
    ----------
    indices : int32 ``(>= num_rows, maxC)``, contiguous rows;  lens : int32 ``(>= num_rows,)``
        The workspace.
    positions : int64 ``(>= num_tokens,)``
        Absolute position of each token of the step.
    ratio : int
        ``R``: tokens per compressed entry (128 for C128A).
    first_row, num_rows : int
        Static: the chunk's first prefill row and its rows.
    num_tokens : int
        Static extent of the step's tokens (padding included): ``nt`` when ``step_counts``
        is None.
    num_decode_tokens : int
        ``Td`` when ``step_counts`` is None, else ignored.
    step_counts : int32 device ``(4,)`` or None
        The staging's ``[k, nt, D, Td]``: read ``Td`` and ``nt`` there.
    block_tokens : int, optional
        Rows per Triton program; default 2 compiled, 64 interpreted.
    """
    if num_rows == 0:
        return
    if backend == "triton":
        if block_tokens is None:
            block_tokens = 64 if triton_interpreted() else 2
        width = indices.shape[-1]
        counts = lens if step_counts is None else step_counts  # never read without counts
        launch(_chunk_kernel(), (grid_size(num_rows, block_tokens),),
               positions, indices, lens, counts, first_row, num_rows, num_tokens,
               num_decode_tokens, DEVICE_COUNTS=step_counts is not None, WIDTH=width,
               RATIO=ratio, BLOCK_T=block_tokens, BLOCK_C=min(pow2_at_least(width, 16), 1024))
    else:
        _build_torch(indices, lens, positions, ratio, first_row, num_rows, num_tokens,
                     num_decode_tokens, step_counts)


def _build_torch(indices, lens, positions, ratio, first_row, num_rows, num_tokens,
                 num_decode_tokens, step_counts) -> None:
    dev = positions.device
    if step_counts is None:
        td = torch.full((), num_decode_tokens, device=dev)
        nt = torch.full((), num_tokens, device=dev)
    else:
        td, nt = step_counts[COUNT_DECODE_TOKENS], step_counts[COUNT_TOKENS]
    t = td + first_row + torch.arange(num_rows, device=dev)
    live = (t < nt)[:, None]
    # Dead rows read position 0's token (any in-range index serves: their row is -1).
    pos = positions[torch.where(live[:, 0], t, 0), None].int()
    width = indices.shape[-1]
    n_c = complete_groups(pos, ratio, width)
    o = torch.arange(width, device=dev, dtype=torch.int32)
    lens[:num_rows].copy_(torch.where(live, n_c, 0)[:, 0])
    indices[:num_rows].copy_(torch.where(live & (o < n_c), o, -1))


@lazy_jit(step_counts_jit, dense_rows_jit)
def _chunk_kernel(triton, tl, live_count, SLOT_TOKENS, SLOT_DECODE_TOKENS, dense_rows, **_):
    # The chunk's rows and first row change with every chunk of a step: no specialisation
    # on them, one compiled kernel serves every chunk.
    @triton.jit(do_not_specialize=["first_row", "num_rows", "num_tokens",
                                   "num_decode_tokens"])
    def dense_prefill_chunk_kernel(
        positions, indices, lens, counts, first_row, num_rows, num_tokens, num_decode_tokens,
        DEVICE_COUNTS: tl.constexpr, WIDTH: tl.constexpr, RATIO: tl.constexpr,
        BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
    ):
        i = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        in_chunk = i < num_rows
        td = live_count(counts, SLOT_DECODE_TOKENS, num_decode_tokens, DEVICE_COUNTS)
        nt = live_count(counts, SLOT_TOKENS, num_tokens, DEVICE_COUNTS)
        t = td + first_row + i
        live = in_chunk & (t < nt)
        pos = tl.load(positions + t, mask=live, other=0).to(tl.int32)
        n_c = tl.minimum(tl.maximum(pos + 1, 0) // RATIO, WIDTH)
        # LOCAL rows read no block table: the workspace stands in for it.
        dense_rows(indices, lens, i, in_chunk, tl.where(live, n_c, 0), indices, 0,
                   i.to(tl.int64), True, WIDTH, 1, BLOCK_C)

    return dense_prefill_chunk_kernel
