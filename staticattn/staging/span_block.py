"""The image-span block of a vision model's arena (DeepSeek V4's vision variant,
``vllm-0.33-extras.md`` §3): how a step's checked spans are staged.

A span ``(request, first, last)`` marks positions ``first .. last`` (inclusive) of one
request as one image: a prefill token inside it sees the rest of the span behind it up to
``mit - 1`` tokens and up to ``mit`` span tokens ahead of it (``mit`` =
``ArenaConfig.max_image_tokens``), bidirectionally inside the span, causally outside it
(§3.4). Decode rows never change.

Spans are staged like the other small inputs: the host writes a step's ``m`` spans into the
first rows of a pinned block of ``max_image_spans`` rows and their count into the pinned
counts (``host_counts[COUNT_SPANS]``); the general staging kernel, which reads the other
pinned inputs, brings the block to the device with every row past the count unused (request
-1, which no token has; no graph node of its own: :func:`staticattn.kernels.staging.
stage_inputs.stage_general`). No branch inside a graph depends on whether a step has spans;
a step without any stages a count of 0. Nothing on the host clears rows: an engine stepping
in place writes the block's first ``m`` rows itself and launches with ``num_spans=m``, and
whatever it left past them is never read. The checks of the spans are
:mod:`staticattn.validation.image_spans`'.
"""

from __future__ import annotations

import struct

import numpy as np
import torch

from staticattn.validation.image_spans import SPAN_FIELDS

__all__ = ["ImageSpans", "NO_REQUEST"]

#: The request of an unused span row: no token matches it.
NO_REQUEST = -1


class ImageSpans:
    """The span block of an arena: host staging rows, their count and their device copy.

    Attributes
    ----------
    host : int32 host ``(max_image_spans, 3)`` (pinned on CUDA)
        Rows ``(request, first, last)``; the step's first, as many as its span count (the
        pinned counts', :class:`~staticattn.staging.pinned_counts.PinnedCounts`).
    device : int32 device ``(max_image_spans, 3)``
        What the SWA kernels read (``batch.image_spans``): the step's rows, then unused rows
        ``(-1, -1, -1)``.
    """

    def __init__(self, host: torch.Tensor, device: torch.Tensor) -> None:
        self.host = host
        self.device = device
        self.capacity = capacity = host.shape[0]
        # The host block's bytes, written with one struct call per step: a few spans cost
        # less that way than through numpy's conversion of a list of tuples.
        self._bytes = host.numpy().reshape(-1).view(np.uint8).data
        self._packers = [struct.Struct(f"<{SPAN_FIELDS * n}i") for n in range(capacity + 1)]
        #: Rows :meth:`stage` wrote since the block last went out to an engine.
        self._staged = 0

    def stage(self, rows) -> int:
        """Write checked rows ``(request, first, last)`` (tuples or lists; None: no span)
        into the host block and return how many (the step's span count, for the pinned
        counts); the caller has waited for the staging to be free."""
        n = 0 if rows is None else len(rows)
        if n:
            try:  # sum() joins a few short tuples faster than itertools.chain unpacks them
                words = sum(rows, ())
            except TypeError:  # rows given as lists
                words = [x for row in rows for x in row]
            self._packers[n].pack_into(self._bytes, 0, *words)
            if n > self._staged:
                self._staged = n
        return n

    def handed_out(self) -> None:
        """The host block goes out as an in-place view: the rows :meth:`stage` wrote are
        marked unused, so that an engine finds only rows it wrote itself (an engine whose
        steps are found by a scan keeps every other row unused)."""
        if self._staged:
            self.host[: self._staged] = NO_REQUEST
            self._staged = 0

    def clear_device(self) -> None:
        """Mark every device row unused, for a step the general staging kernel does not
        stage (device-decided lengths, whose steps carry no spans): one fill of a fixed
        address (a graph node when captured)."""
        self.device.fill_(NO_REQUEST)
