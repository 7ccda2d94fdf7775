"""Buffer declarations: what a builder asks the arena for."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from staticattn.errors import ArenaError

__all__ = ["BufferDecl", "NULL_BLOCK_ID", "PAD_SLOT_ID", "Where"]

Where = Literal["device", "host"]

#: Slot of a token whose KV is not written (graph padding, or told so by the engine).
PAD_SLOT_ID = -1
#: Block 0 is reserved as the null block: padded requests' rows point at it.
NULL_BLOCK_ID = 0


@dataclass(frozen=True, slots=True)
class BufferDecl:
    """One named buffer of the arena.

    Parameters
    ----------
    name : str
        Unique within the arena, dotted by owner: ``"indexer.decode_seq_lens"``.
    shape : tuple of int
        Fixed for the arena's lifetime.
    dtype : torch.dtype
    where : {"device", "host"}
        "device" buffers live in the one device block; "host" buffers in the one host
        staging block (pinned when CUDA is present).
    fill : int, float or None
        Initial value written once at allocation; None leaves the memory uninitialised
        (only for buffers every build overwrites before any read).
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    where: Where = "device"
    fill: int | float | None = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if not self.name or not isinstance(self.name, str):
            raise ArenaError(f"buffer name {self.name!r} must be a non-empty string")
        if any(s < 0 for s in self.shape):
            raise ArenaError(f"buffer {self.name!r}: shape {self.shape} has a negative size")
        if self.where not in ("device", "host"):
            raise ArenaError(f"buffer {self.name!r}: where={self.where!r} is not device or host")
        if not isinstance(self.dtype, torch.dtype):
            raise ArenaError(f"buffer {self.name!r}: dtype {self.dtype!r} is not a torch.dtype")

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize
