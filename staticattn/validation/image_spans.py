"""The host checks of a step's image spans (DeepSeek V4's vision variant,
``vllm-0.33-extras.md`` §3), before anything is written.

A span ``(request, first, last)`` marks positions ``first .. last`` (inclusive) of one
request as one image. The checks (:func:`check_image_spans`): at most ``max_image_spans``
spans, each of an existing request with ``0 <= first <= last < seq_lens[request]``, spans of
one request do not overlap (the reference lets the last matching span win), a span lies
wholly in the step's query or wholly before it (spans are scheduled whole, §3.2: a chunk
never ends inside an image), and a span holds at most ``W + mit`` tokens -- a longer one would
give its tokens windows past the prefill row's width (the reference writes the row's ``W +
mit`` columns and stores the longer length, §3.4). Every error names the span. Spans in order
(by request, then position) pass through plain comparisons (:func:`spans_pass`); anything
else goes through the full check.

Example (§3.6): spans ``{0: [(2, 5)], 1: [(1, 3), (9, 12)]}`` are the rows
``[[0, 2, 5], [1, 1, 3], [1, 9, 12]]``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from staticattn.arena.config import ArenaConfig
from staticattn.errors import CapacityError, InvalidBatchError

__all__ = ["SPAN_FIELDS", "check_image_spans", "max_span_tokens", "spans_pass"]

#: Columns of a span row: request, first position, last position (inclusive).
SPAN_FIELDS = 3


def _as_rows(config: ArenaConfig, spans):
    """The span rows of any accepted form, not yet checked."""
    if not config.image_spans:
        raise InvalidBatchError("image_spans were given, but the config has "
                                "max_image_tokens=0 (a text model): pass None")
    if isinstance(spans, Mapping):
        return [(b, first, last) for b, ranges in sorted(spans.items())
                for first, last in ranges]
    if isinstance(spans, np.ndarray):
        if spans.size and (spans.ndim != 2 or spans.shape[1] != SPAN_FIELDS
                           or not np.issubdtype(spans.dtype, np.integer)):
            raise InvalidBatchError(f"image_spans must be rows of (request, first, last) "
                                    f"ints, got shape {spans.shape}, dtype {spans.dtype}")
        return spans.tolist()
    return spans


def _ints(i: int, row) -> tuple[int, int, int]:
    """Row ``i`` as three Python ints (numpy ints converted), or the error naming it."""
    try:
        b, first, last = row
    except (TypeError, ValueError):
        raise InvalidBatchError(f"image span {i} must be (request, first, last) ints, "
                                f"got {row!r}") from None
    if type(b) is int and type(first) is int and type(last) is int:
        return b, first, last
    if not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool)
               for x in (b, first, last)):
        raise InvalidBatchError(f"image span {i} must be (request, first, last) ints, "
                                f"got {row!r}")
    return int(b), int(first), int(last)


def max_span_tokens(config: ArenaConfig) -> int:
    """The most tokens a span may hold, ``sliding_window + max_image_tokens``: the prefill
    SWA row's width, which a longer span's windows would pass (0 for a text model, which
    may have no window)."""
    return config.sliding_window + config.max_image_tokens if config.image_spans else 0


def spans_pass(rows, query_lens: np.ndarray, seq_lens: np.ndarray, reach: int) -> bool:
    """Whether ``rows`` (a sequence of ``(request, first, last)``, a list or tuple each) are
    spans every check of :func:`check_image_spans` passes, given in order: by request, then
    position, no two overlapping. ``query_lens``, ``seq_lens``: host ints ``(num_reqs,)``,
    any integer dtype (valid lengths: ``seq_lens`` may be an unsigned view); ``reach``:
    :func:`max_span_tokens`. The capacity is the caller's to test.

    The fast path of the check, for every step that carries spans: plain comparisons only,
    about a third of the full check's cost. False for anything else -- a bad span, a
    non-int, spans out of order -- and the full check then decides and names the span.
    """
    seq, query, num_reqs = seq_lens.item, query_lens.item, seq_lens.shape[0]
    prev_b = prev_last = -1
    try:
        for b, first, last in rows:
            # ``type(x) is int`` also refuses bools, numpy ints and floats.
            if not (type(b) is type(first) is type(last) is int and 0 <= b < num_reqs):
                return False
            length = seq(b)
            # In order and apart from the previous span; inside the request; not across
            # its first query position; at most ``reach`` tokens.
            if (b < prev_b or b == prev_b and first <= prev_last
                    or not 0 <= first <= last < length or last - first >= reach
                    or first < length - query(b) <= last):
                return False
            prev_b, prev_last = b, last
    except (TypeError, ValueError):  # a row that is not three values
        return False
    return True


def check_image_spans(config: ArenaConfig, spans, query_lens: np.ndarray,
                      seq_lens: np.ndarray) -> list[tuple[int, int, int]] | None:
    """The spans of a step of ``query_lens``, ``seq_lens`` (host ints ``(num_reqs,)``) as
    checked ``(request, first, last)`` rows (see the module), or None for None: ``spans``
    itself when it is a list or tuple of rows that :func:`spans_pass`, else new triples.
    Raises :class:`InvalidBatchError` or :class:`CapacityError` naming the first bad
    span."""
    if spans is None:
        return None
    reach = max_span_tokens(config)
    if (type(spans) in (list, tuple) and config.image_spans
            and len(spans) <= config.max_image_spans
            and spans_pass(spans, query_lens, seq_lens, reach)):
        return spans
    # One pass of plain Python, for what the fast path did not pass: a step carries a few
    # spans, and a numpy call costs more than the whole check of three. Spans given in
    # order (by request, then position) are checked for overlap against their predecessor
    # as they pass; others are sorted after.
    # Rows in a list or tuple skip the abstract-class tests, which cost as much as a span.
    raw = spans if type(spans) in (list, tuple) and config.image_spans else \
        _as_rows(config, spans)
    if type(raw) not in (list, tuple):
        raw = list(raw)
    if len(raw) > config.max_image_spans:  # named once every row is three ints
        b, first, last = [_ints(i, row) for i, row in enumerate(raw)][config.max_image_spans]
        raise CapacityError(
            f"image span {config.max_image_spans} (request {b}, positions [{first}, {last}]) "
            f"exceeds the capacity max_image_spans={config.max_image_spans}")
    num_reqs = seq_lens.shape[0]
    rows = []
    ordered, prev = True, (-1, -1, -1)
    for i, row in enumerate(raw):
        try:
            b, first, last = row
        except (TypeError, ValueError):
            b = first = last = None  # _ints names the row
        if not type(b) is type(first) is type(last) is int:
            b, first, last = _ints(i, row)
        row = (b, first, last)
        rows.append(row)
        if not 0 <= b < num_reqs:
            raise InvalidBatchError(f"{_name(i, rows)}: request {b} is outside the step's "
                                    f"{num_reqs} requests")
        length = seq_lens.item(b)  # a Python int: the arrays are integer arrays
        if not 0 <= first <= last < length:
            raise InvalidBatchError(f"{_name(i, rows)} runs outside its request: it needs 0 "
                                    f"<= first <= last < seq_lens[{b}] = {length}")
        context = length - query_lens.item(b)
        if first < context <= last:
            raise InvalidBatchError(
                f"{_name(i, rows)} straddles the first query position {context} of request "
                f"{b}: an image is scheduled whole, in one step")
        if last - first >= reach:
            raise InvalidBatchError(
                f"{_name(i, rows)} holds {last - first + 1} tokens, more than sliding_window "
                f"+ max_image_tokens = {reach}: its rows would pass the prefill row width")
        if ordered:
            if row <= prev:  # out of order (or a repeat): sorted below
                ordered = False
            elif b == prev[0] and first <= prev[2]:
                _overlap(rows, i - 1, i)
        prev = row
    if not ordered:
        ranked = sorted(range(len(rows)), key=rows.__getitem__)
        for before, after in zip(ranked, ranked[1:]):
            if rows[before][0] == rows[after][0] and rows[after][1] <= rows[before][2]:
                _overlap(rows, *sorted((before, after)))
    return rows


def _overlap(rows: list[tuple[int, int, int]], i: int, j: int) -> None:
    raise InvalidBatchError(
        f"{_name(j, rows)} overlaps image span {i} (positions [{rows[i][1]}, {rows[i][2]}]): "
        f"spans of one request must not overlap")


def _name(i: int, rows: list[tuple[int, int, int]]) -> str:
    b, first, last = rows[i]
    return f"image span {i} (request {b}, positions [{first}, {last}])"
