"""The pinned staging as numpy views an engine writes a step into, in place.

What an integer view accepts is numpy's assignment: an integer array of any dtype is cast
to the view's (int32 for the lengths and starts, int64 for the slots) -- a value past the
view's range wraps around -- a float is truncated (``100.7`` -> ``100``) and a bool read as
0 or 1, without a word. No check after the write can tell such a value from one the engine
meant, so write integer arrays of the view's dtype (docs/embedding.md)."""

from __future__ import annotations

import numpy as np

from staticattn.kernels.staging.pinned_staging import PinnedStaging

__all__ = ["HostViews"]


class HostViews(PinnedStaging[np.ndarray]):
    """Numpy views of the pinned staging, which an engine may write in place: the fields of
    :class:`~staticattn.kernels.staging.pinned_staging.PinnedStaging` (their dtypes and
    shapes), the same memory the staging kernels read."""

    __slots__ = ()
