"""Gather lengths of the prefill requests of a sparse sliding-window step (spec §6.7).

A prefill request ``r`` with query length ``q`` and context ``c = L_r - q`` gathers all its
query tokens plus the up-to-``W - 1`` context tokens its first query token can still see:
``gather_len = q + min(c, W - 1)``. Example (W = 128): ``L = 50, q = 50`` -> 50;
``L = 1000, q = 500`` -> 627; ``L = 300, q = 100`` -> 227.

Eager only (it runs when a step has prefills), but graph-safe like every kernel here. The
Triton version uses a fixed block and a grid over it, so a new prefill count never compiles a
new specialisation (the reference re-specialises per power of two of the count).
"""

from __future__ import annotations

import torch

from staticattn.kernels.lazy import lazy_jit

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
) -> None:
    """Write ``out[i]``, the gather length of request ``num_decodes + i``, for ``i < num_prefills``.

    Parameters
    ----------
    backend : {"torch", "triton"}
    seq_lens : int32 ``(>= num_decodes + num_prefills,)``
    query_start_loc : int32 ``(>= num_decodes + num_prefills + 1,)``
    num_decodes, num_prefills : int
        Static: the prefills are requests ``[num_decodes, num_decodes + num_prefills)``.
    window : int
        Sliding window ``W``.
    out : int32 ``(>= num_prefills,)``
    """
    if num_prefills == 0:
        return
    if backend == "triton":
        import triton

        _gather_lens_kernel()[(triton.cdiv(num_prefills, _BLOCK),)](
            out, seq_lens, query_start_loc, num_decodes, num_prefills, window, BLOCK=_BLOCK,
        )
        return
    d, end = num_decodes, num_decodes + num_prefills
    query_lens = query_start_loc[d + 1 : end + 1] - query_start_loc[d:end]
    context = seq_lens[d:end] - query_lens
    out[:num_prefills].copy_(query_lens + torch.clamp(context, max=window - 1))


@lazy_jit
def _gather_lens_kernel():
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["num_decodes", "num_prefills"])
    def gather_lens_kernel(out, seq_lens, qsl, num_decodes, num_prefills, window,
                           BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < num_prefills
        r = num_decodes + i
        query_len = tl.load(qsl + r + 1, mask=m, other=0) - tl.load(qsl + r, mask=m, other=0)
        context = tl.load(seq_lens + r, mask=m, other=0) - query_len
        tl.store(out + i, query_len + tl.minimum(context, window - 1), mask=m)

    return gather_lens_kernel
