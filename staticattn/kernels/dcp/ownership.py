"""Decode context parallelism (DCP): which of a sequence's entries one rank holds.

A sequence's entries (tokens, or compressed entries) are dealt to ``world`` ranks
round-robin in groups of ``interleave``: entries ``[k I, (k + 1) I)`` live on rank
``k % world``. Two questions follow, each answered here once, for torch tensors and inside
Triton kernels:

* **local count** -- of the first ``n`` entries, how many rank ``r`` holds:
  ``base + clip(n - base * world - r * I, 0, I)`` with ``base = (n // (I * world)) * I``
  (whole rounds). World 2, rank 1, ``I = 1``: ``[8, 9, 10] -> [4, 4, 5]``.
* **local index** -- where entry ``e`` sits in its owner's local sequence:
  ``(e // (I * world)) * I + e % I``, owner ``(e // I) % world``.

A compressed entry ``c`` of ratio ``R`` covers tokens ``[cR, (c + 1) R)``; with ``I`` a
multiple of ``R`` they all sit in interleave group ``cR // I``, so the compressed entries are
dealt the same way at interleave ``I // R``: the same two formulas apply to compressed counts
and indices with ``interleave = I // R``.

Counts and indices are non-negative here (callers clamp first), so Triton's truncating
``//`` and torch's floor ``//`` agree.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from staticattn.kernels.runtime.deferred import lazy_jit

__all__ = ["DCPShard", "dcp_global_index", "dcp_local_count", "dcp_local_index", "dcp_owner",
           "triton_dcp_helpers"]


class DCPShard(NamedTuple):
    """One rank's view of decode context parallelism, all static ints: ``world`` ranks,
    this ``rank``, and the ``interleave`` of the entries being counted (``I // R`` for
    compressed entries of ratio ``R``). A kernel given None (or ``world == 1``) computes
    the global values."""

    world: int
    rank: int
    interleave: int


def dcp_local_count(n: torch.Tensor, world: int, rank: int, interleave: int) -> torch.Tensor:
    """Entries among the first ``n`` (a non-negative int tensor, any shape) that ``rank``
    holds; same dtype and shape as ``n``. The identity when ``world == 1``."""
    if world == 1:
        return n
    base = torch.div(n, interleave * world, rounding_mode="floor") * interleave
    return base + (n - base * world - rank * interleave).clamp(0, interleave)


def dcp_owner(e: torch.Tensor, world: int, interleave: int) -> torch.Tensor:
    """The rank holding entry ``e`` (``e``: non-negative int tensor of any shape; the
    result has its shape and dtype)."""
    return torch.div(e, interleave, rounding_mode="floor") % world


def dcp_local_index(e: torch.Tensor, world: int, interleave: int) -> torch.Tensor:
    """Entry ``e``'s index in its owner's local sequence (``e``: non-negative int tensor
    of any shape; the result has its shape and dtype)."""
    return torch.div(e, interleave * world, rounding_mode="floor") * interleave + e % interleave


def dcp_global_index(j: torch.Tensor, world: int, rank: int, interleave: int) -> torch.Tensor:
    """The entry that ``rank``'s local index ``j`` holds, the inverse of
    :func:`dcp_local_index`: ``(j // I) * I * world + rank * I + j % I`` (``j``: non-negative
    int tensor of any shape; the result has its shape and dtype)."""
    return (torch.div(j, interleave, rounding_mode="floor") * (interleave * world)
            + rank * interleave + j % interleave)


@lazy_jit()
def triton_dcp_helpers(triton, tl):
    """``(local_count, owner, local_index, global_index)``: the same formulas as
    ``@triton.jit`` helpers (a kernel takes them by naming this function in its
    :func:`~staticattn.kernels.runtime.deferred.lazy_jit`)."""

    @triton.jit
    def dcp_local_count_tl(n, world, rank, interleave):
        base = (n // (interleave * world)) * interleave
        rem = n - base * world - rank * interleave
        return base + tl.minimum(tl.maximum(rem, 0), interleave)

    @triton.jit
    def dcp_owner_tl(e, world, interleave):
        return (e // interleave) % world

    @triton.jit
    def dcp_local_index_tl(e, world, interleave):
        return (e // (interleave * world)) * interleave + e % interleave

    @triton.jit
    def dcp_global_index_tl(j, world, rank, interleave):
        return (j // interleave) * (interleave * world) + rank * interleave + j % interleave

    return dcp_local_count_tl, dcp_owner_tl, dcp_local_index_tl, dcp_global_index_tl
