"""Which segment of a prefix-sum array holds each index: the token -> row (or entry ->
region) search every PCP build and layer makes on the device, written once."""

from __future__ import annotations

import torch

__all__ = ["segment_of"]


def segment_of(cu: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Segment of each of ``index`` under the prefix sums ``cu``.

    Parameters
    ----------
    cu : int tensor ``(..., S + 1)``
        Non-decreasing segment starts, ``cu[..., 0] = 0`` (a batch of them along the leading
        dimensions, one per row of ``index``).
    index : int tensor ``(..., M)``
        Positions to place.

    Returns
    -------
    int64 tensor ``(..., M)``
        The last ``s`` with ``cu[..., s] <= index`` that begins a non-empty segment, at most
        ``S - 1``: an index past ``cu[..., -1]`` lands in the last segment, which callers
        mask out.
    """
    return torch.searchsorted(cu[..., 1:].contiguous(), index, right=True).clamp(
        max=cu.shape[-1] - 2)
