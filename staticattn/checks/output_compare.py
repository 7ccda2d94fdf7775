"""Step outputs compared bit for bit: copies taken before the next run overwrites them."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten

__all__ = ["same_outputs", "snapshot_outputs"]


def snapshot_outputs(outputs: Any, num_tokens: int | None = None) -> list[torch.Tensor]:
    """Copies of every tensor in a step's outputs (first ``num_tokens`` rows when given),
    taken before the next run overwrites them: each tensor's dtype and shape (leading
    dimension cut to ``num_tokens``)."""
    flat, _ = tree_flatten(outputs)
    # A 0-dim output (a count) has no rows: taken whole.
    return [(t[:num_tokens] if t.dim() else t).clone() for t in flat
            if isinstance(t, torch.Tensor)]


def same_outputs(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """Bit-for-bit equality of two :func:`snapshot_outputs` (tensors of any dtype and
    shape, compared pairwise)."""
    return len(a) == len(b) and all(
        x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b)
    )
