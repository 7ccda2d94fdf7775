"""Gather lengths of the prefill requests of a sparse sliding-window step (spec §6.7).

A prefill request ``r`` with query length ``q`` and context ``c = L_r - q`` gathers all its
query tokens plus the up-to-``W - 1`` context tokens its first query token can still see:
``gather_len = q + min(c, W - 1)``. Example (W = 128): ``L = 50, q = 50`` -> 50;
``L = 1000, q = 500`` -> 627; ``L = 300, q = 100`` -> 227.

Row ``i`` is request ``D + i``; the kernel also writes that request's sequence length, so a
build whose split is decided on the device (``step_counts``) hands out ``prefill_seq_lens``
without slicing at a host-known ``D``. Rows past the real prefills get 0 and 0.

Graph-safe like every kernel here. The Triton version uses a fixed block and a grid over it,
so a new prefill count never compiles a new specialisation (the reference re-specialises per
power of two of the count).
"""

from __future__ import annotations

import torch

from staticattn.kernels.launch import grid_size, launch
from staticattn.kernels.lazy import lazy_jit
from staticattn.kernels.staging import COUNT_DECODES, COUNT_REQS

__all__ = ["prefill_gather_lens"]

_BLOCK = 128


def prefill_gather_lens(
    backend: str,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_decodes: int,
    num_prefills: int,
    window: int,
    out: torch.Tensor,
    seq_lens_out: torch.Tensor | None = None,
    step_counts: torch.Tensor | None = None,
) -> None:
    """Write ``out[i]``, the gather length of request ``num_decodes + i``, for ``i < num_prefills``.

    Parameters
    ----------
    backend : {"torch", "triton"}
    seq_lens : int32 ``(>= num_decodes + num_prefills,)``
    query_start_loc : int32 ``(>= num_decodes + num_prefills + 1,)``
    num_decodes, num_prefills : int
        Static: the prefills are requests ``[num_decodes, num_decodes + num_prefills)``. With
        ``step_counts``, ``num_decodes`` is ignored and ``num_prefills`` is the static extent
        of the rows (the real ones are ``[D, k)`` from the device).
    window : int
        Sliding window ``W``.
    out : int32 ``(>= num_prefills,)``
    seq_lens_out : int32 ``(>= num_prefills,)`` or None
        Also write each row's sequence length.
    step_counts : int32 device ``(4,)`` or None
        The staging's ``[k, nt, D, Td]``.
    """
    if num_prefills == 0:
        return
    if backend == "triton":
        launch(_gather_lens_kernel(), (grid_size(num_prefills, _BLOCK),),
            out, seq_lens_out if seq_lens_out is not None else out, seq_lens, query_start_loc,
            out if step_counts is None else step_counts, num_decodes, num_prefills, window,
            WRITE_SEQ_LENS=seq_lens_out is not None, DEVICE_COUNTS=step_counts is not None,
            BLOCK=_BLOCK,
        )
        return
    dev = seq_lens.device
    i = torch.arange(num_prefills, device=dev)
    if step_counts is None:
        first, live = num_decodes, torch.ones_like(i, dtype=torch.bool)
    else:
        first = step_counts[COUNT_DECODES]
        live = first + i < step_counts[COUNT_REQS]
    r = torch.where(live, first + i, 0)
    query_lens = query_start_loc[r + 1] - query_start_loc[r]
    context = seq_lens[r] - query_lens
    gather = query_lens + torch.clamp(context, max=window - 1)
    out[:num_prefills].copy_(torch.where(live, gather, 0))
    if seq_lens_out is not None:
        seq_lens_out[:num_prefills].copy_(torch.where(live, seq_lens[r], 0))


@lazy_jit
def _gather_lens_kernel():
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["num_decodes", "num_prefills"])
    def gather_lens_kernel(out, seq_lens_out, seq_lens, qsl, counts, num_decodes, num_prefills,
                           window, WRITE_SEQ_LENS: tl.constexpr, DEVICE_COUNTS: tl.constexpr,
                           BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        rows = i < num_prefills
        if DEVICE_COUNTS:
            first = tl.load(counts + 2)
            live = rows & (first + i < tl.load(counts))
        else:
            first = num_decodes
            live = rows
        r = first + i
        query_len = tl.load(qsl + r + 1, mask=live, other=0) - tl.load(qsl + r, mask=live,
                                                                        other=0)
        seq_len = tl.load(seq_lens + r, mask=live, other=0)
        gather = query_len + tl.minimum(seq_len - query_len, window - 1)
        tl.store(out + i, tl.where(live, gather, 0), mask=rows)
        if WRITE_SEQ_LENS:
            tl.store(seq_lens_out + i, seq_len, mask=rows)

    return gather_lens_kernel
