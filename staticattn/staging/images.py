"""Image spans, a step input of DeepSeek V4's vision variant (``vllm-0.33-extras.md`` §3).

A span ``(request, first, last)`` marks positions ``first .. last`` (inclusive) of one
request as one image: a prefill token inside it sees the rest of the span behind it up to
``mit - 1`` tokens and up to ``mit`` span tokens ahead of it (``mit`` =
``ArenaConfig.max_image_tokens``), bidirectionally inside the span, causally outside it
(§3.4). Decode rows never change.

Spans are staged like the other small inputs: the host writes them into a pinned block of
``max_image_spans`` rows (unused rows carry request -1, which no token has) and one copy,
the same node in every graph that reads them, brings the whole block to the device. No
branch inside a graph depends on whether a step has spans; a step without any stages an
empty block.

The host checks, before anything is written (:func:`check_image_spans`): at most
``max_image_spans`` spans, each of an existing request with ``0 <= first <= last <
seq_lens[request]``, spans of one request do not overlap (the reference lets the last
matching span win), a span lies wholly in the step's query or wholly before it (spans are
scheduled whole, §3.2: a chunk never ends inside an image), and a span holds at most
``W + mit`` tokens -- a longer one would give
its tokens windows past the prefill row's width (the reference writes the row's ``W + mit``
columns and stores the longer length, §3.4). Every error names the span.

Example (§3.6): spans ``{0: [(2, 5)], 1: [(1, 3), (9, 12)]}`` are the rows
``[[0, 2, 5], [1, 1, 3], [1, 9, 12]]``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from staticattn.arena.config import ArenaConfig
from staticattn.errors import CapacityError, InvalidBatchError

__all__ = ["ImageSpans", "check_image_spans", "image_span_array"]

#: Columns of a span row: request, first position, last position (inclusive).
SPAN_FIELDS = 3
#: The request of an unused span row: no token matches it.
NO_REQUEST = -1


def image_span_array(config: ArenaConfig, spans) -> np.ndarray:
    """``spans`` as host int64 rows ``(n, 3)`` of ``(request, first, last)``, from rows of
    three ints or a mapping ``request -> [(first, last), ...]`` (the reference's per-request
    ranges), after the checks that need no lengths. Raises :class:`InvalidBatchError` when
    the arena has no image spans or the shape is wrong, :class:`CapacityError` past
    ``max_image_spans``."""
    if not config.image_spans:
        raise InvalidBatchError("image_spans were given, but the config has "
                                "max_image_tokens=0 (a text model): pass None")
    if isinstance(spans, Mapping):
        spans = [(b, first, last) for b, ranges in sorted(spans.items())
                 for first, last in ranges]
    rows = np.asarray(spans)
    if rows.size == 0:
        return np.zeros((0, SPAN_FIELDS), dtype=np.int64)
    if rows.ndim != 2 or rows.shape[1] != SPAN_FIELDS or not np.issubdtype(rows.dtype,
                                                                            np.integer):
        raise InvalidBatchError(f"image_spans must be rows of (request, first, last) ints, "
                                f"got shape {rows.shape}, dtype {rows.dtype}")
    if rows.shape[0] > config.max_image_spans:
        b, first, last = (int(x) for x in rows[config.max_image_spans])
        raise CapacityError(
            f"image span {config.max_image_spans} (request {b}, positions [{first}, {last}]) "
            f"exceeds the capacity max_image_spans={config.max_image_spans}")
    return rows.astype(np.int64)


def check_image_spans(config: ArenaConfig, spans, query_lens: np.ndarray,
                      seq_lens: np.ndarray) -> np.ndarray | None:
    """The spans of a step of ``query_lens``, ``seq_lens`` (host ints ``(num_reqs,)``) as
    checked rows ``(n, 3)`` (see the module), or None for None. Raises
    :class:`InvalidBatchError` or :class:`CapacityError` naming the first bad span."""
    if spans is None:
        return None
    rows = image_span_array(config, spans)
    if rows.shape[0] == 0:
        return rows
    num_reqs, reach = seq_lens.shape[0], config.sliding_window + config.max_image_tokens
    for i, (b, first, last) in enumerate(rows.tolist()):
        name = f"image span {i} (request {b}, positions [{first}, {last}])"
        if not 0 <= b < num_reqs:
            raise InvalidBatchError(f"{name}: request {b} is outside the step's "
                                    f"{num_reqs} requests")
        if not 0 <= first <= last < int(seq_lens[b]):
            raise InvalidBatchError(f"{name} runs outside its request: it needs 0 <= first "
                                    f"<= last < seq_lens[{b}] = {int(seq_lens[b])}")
        context = int(seq_lens[b]) - int(query_lens[b])
        if first < context <= last:
            raise InvalidBatchError(
                f"{name} straddles the first query position {context} of request {b}: "
                "an image is scheduled whole, in one step")
        if last - first + 1 > reach:
            raise InvalidBatchError(
                f"{name} holds {last - first + 1} tokens, more than sliding_window + "
                f"max_image_tokens = {reach}: its rows would pass the prefill row width")
    order = np.lexsort((rows[:, 1], rows[:, 0]))
    ranked = rows[order]
    clash = np.flatnonzero((ranked[1:, 0] == ranked[:-1, 0]) & (ranked[1:, 1] <= ranked[:-1, 2]))
    if clash.size:
        i, j = int(order[clash[0]]), int(order[clash[0] + 1])
        b = int(rows[i, 0])
        raise InvalidBatchError(
            f"image span {j} (request {b}, positions [{rows[j, 1]}, {rows[j, 2]}]) overlaps "
            f"image span {i} (positions [{rows[i, 1]}, {rows[i, 2]}]): spans of one request "
            "must not overlap")
    return rows


class ImageSpans:
    """The span block of an arena: host staging rows and their device copy.

    Attributes
    ----------
    host : int32 host ``(max_image_spans, 3)`` (pinned on CUDA)
        Rows ``(request, first, last)``; unused rows ``(-1, 0, -1)``.
    device : int32 device ``(max_image_spans, 3)``
        What the SWA kernels read (``batch.image_spans``).
    """

    def __init__(self, host: torch.Tensor, device: torch.Tensor) -> None:
        self.host = host
        self.device = device
        self._rows = host.numpy()
        self.stage(None)

    def stage(self, rows: np.ndarray | None) -> None:
        """Write checked rows ``(n, 3)`` (None: no span) into the host block, every other
        row unused (an in-place step may have written any); the caller has waited for the
        staging to be free."""
        n = 0 if rows is None else rows.shape[0]
        if n:
            self._rows[:n] = rows
        self._rows[n:] = (NO_REQUEST, 0, NO_REQUEST)

    def copy_to_device(self) -> None:
        """The block to the device: one copy of fixed addresses (a graph node when captured),
        before the staging guard's event."""
        self.device.copy_(self.host, non_blocking=True)
