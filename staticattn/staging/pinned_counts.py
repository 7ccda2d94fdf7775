"""The pinned counts of a step: the one writer of the small host block the staging kernels
read a step's real extents from (its layout, the ``COUNT_*`` slots, is the kernels':
:mod:`staticattn.kernels.staging.stage_inputs`).

Slot ``COUNT_REQS`` holds the step's requests, ``COUNT_TOKENS`` its tokens (a step of any
composition) and, on the host side only, ``COUNT_SPANS`` the image-span rows to stage (a
vision model; the kernels write their decode/prefill split into the device copy's slots).
Every host write of the block goes through :class:`PinnedCounts`, whatever front end stages
the step.
"""

from __future__ import annotations

import numpy as np

from staticattn.kernels.staging.stage_inputs import COUNT_REQS, COUNT_SPANS, COUNT_TOKENS

__all__ = ["PinnedCounts"]


class PinnedCounts:
    """Writes a step's counts into the pinned block ``counts`` (int32 host ``(NUM_COUNTS,)``,
    a numpy view); ``span_capacity``: the span block's rows (0 for a text model, whose
    steps stage no span count)."""

    __slots__ = ("_counts", "span_capacity")

    def __init__(self, counts: np.ndarray, span_capacity: int) -> None:
        self._counts = counts
        self.span_capacity = span_capacity
        counts[:] = 0

    def uniform(self, num_reqs: int) -> None:
        """A uniform decode step of ``num_reqs`` requests (its tokens follow from them)."""
        self._counts[COUNT_REQS] = num_reqs

    def step(self, num_reqs: int, num_tokens: int, num_spans: int | None = 0) -> None:
        """A step of any composition: ``num_reqs`` requests, ``num_tokens`` tokens, and the
        first ``num_spans`` rows of the span block as its image spans (None: every row,
        for a scan; ignored for a text model)."""
        counts = self._counts
        counts[COUNT_REQS], counts[COUNT_TOKENS] = num_reqs, num_tokens
        if self.span_capacity:
            counts[COUNT_SPANS] = self.span_capacity if num_spans is None else num_spans

    def spans(self, num_spans: int) -> None:
        """The image-span rows a step stages (a vision model)."""
        if self.span_capacity:
            self._counts[COUNT_SPANS] = num_spans
