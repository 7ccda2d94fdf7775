"""Reorder a batch decode -> short extend -> long extend -> prefill (spec §3.1).

The engine keeps its per-request state in some persistent batch; the reorder only needs the
three counts per request and a way to swap two requests, described by :class:`ReorderState`.
:class:`ListReorderState` is a list-backed implementation for tests and small engines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = [
    "DECODE", "SHORT_EXTEND", "LONG_EXTEND", "PREFILL", "ListReorderState", "ReorderState",
    "reorder_batch_to_split_decodes_and_prefills", "reorder_region",
]

#: Regions in target order.
DECODE, SHORT_EXTEND, LONG_EXTEND, PREFILL = 0, 1, 2, 3


@runtime_checkable
class ReorderState(Protocol):
    """What the reorder reads and does to a persistent batch.

    Attributes
    ----------
    num_reqs : int
        Requests in the batch (positions ``0 .. num_reqs - 1``).
    num_scheduled, num_computed, num_prompt : sequence of int, ``(>= num_reqs,)``
        Per position: tokens scheduled this step, tokens already in the cache, prompt length.
        Read once, before the first swap.
    """

    @property
    def num_reqs(self) -> int: ...

    @property
    def num_scheduled(self) -> Sequence[int]: ...

    @property
    def num_computed(self) -> Sequence[int]: ...

    @property
    def num_prompt(self) -> Sequence[int]: ...

    def swap_states(self, i: int, j: int) -> None:
        """Exchange everything the batch holds for positions ``i`` and ``j``."""
        ...


@dataclass(slots=True)
class ListReorderState:
    """A :class:`ReorderState` over plain lists; ``req_ids`` follow their requests.

    Examples
    --------
    >>> state = ListReorderState(["a", "b"], num_scheduled=[100, 1], num_computed=[0, 7],
    ...                          num_prompt=[100, 7])
    >>> reorder_batch_to_split_decodes_and_prefills(state)
    True
    >>> state.req_ids
    ['b', 'a']
    """

    req_ids: list[object]
    num_scheduled: list[int]
    num_computed: list[int]
    num_prompt: list[int]
    swaps: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    def swap_states(self, i: int, j: int) -> None:
        """Swap the requests at batch positions ``i`` and ``j`` and record the swap."""
        for values in (self.req_ids, self.num_scheduled, self.num_computed, self.num_prompt):
            values[i], values[j] = values[j], values[i]
        self.swaps.append((i, j))


def reorder_region(num_scheduled: int, num_computed: int, num_prompt: int,
                   decode_threshold: int) -> int:
    """The region of one request: :data:`DECODE`, :data:`SHORT_EXTEND`, :data:`LONG_EXTEND`
    or :data:`PREFILL`.

    A request without context (``num_computed == 0``) is a prefill whatever its length; one
    with context is a long extend above the threshold; at or below it, a decode once its
    prompt is done (``num_computed >= num_prompt``), else a short extend.
    """
    if num_computed == 0:
        return PREFILL
    if num_scheduled > decode_threshold:
        return LONG_EXTEND
    return DECODE if num_computed >= num_prompt else SHORT_EXTEND


def reorder_batch_to_split_decodes_and_prefills(
    state: ReorderState, decode_threshold: int = 1
) -> bool:
    """Put every request in its region, regions in order decode, short extend, long extend,
    prefill; only misplaced requests move.

    Parameters
    ----------
    state : ReorderState
        The persistent batch; changed in place through ``swap_states``.
    decode_threshold : int
        Longest scheduled length of a decode (the minimum over the builders' thresholds).

    Returns
    -------
    bool
        Whether any request moved.

    Notes
    -----
    Region ``r`` occupies the positions after the requests of all earlier regions. A request
    already inside its region's range stays where it is. The misplaced requests, taken in
    (region, position) order, fill the misplaced positions in position order, so requests of
    one region that move keep their relative order, but a moved request may land before an
    unmoved one of its region: threshold 1, ``(scheduled, computed)`` =
    ``[(100,100), (1,10), (200,200), (1,20)]`` with finished prompts becomes
    ``[3, 1, 2, 0]`` (only ``0 <-> 3`` swap). That is the reference's behaviour, and what
    spec §3.1's "stable within a region" amounts to. The permutation is applied by following
    its cycles, one ``swap_states`` per element of a cycle but one, so at most
    ``misplaced - 1`` swaps and no copy of the batch.

    v0.20.2 has four regions; vLLM v0.14's version has three (decode = short
    scheduled length with context, whether or not the prompt is done; extend; prefill). A
    short chunked-prefill continuation was a decode there and is a short extend here.

    Examples
    --------
    Threshold 1; ``(scheduled, computed, prompt)``: ``r0 (5, 0, 5)`` prefill,
    ``r1 (1, 10, 10)`` decode, ``r2 (1, 3, 8)`` short extend, ``r3 (4, 3, 8)`` long extend
    -> ``[r1, r2, r3, r0]``.
    """
    num_reqs = state.num_reqs
    scheduled, computed, prompt = state.num_scheduled, state.num_computed, state.num_prompt
    regions = [
        reorder_region(int(scheduled[i]), int(computed[i]), int(prompt[i]), decode_threshold)
        for i in range(num_reqs)
    ]
    # The region each position must hold: the regions' requests counted off in order.
    targets = sorted(regions)
    misplaced = [i for i in range(num_reqs) if regions[i] != targets[i]]
    if not misplaced:
        return False
    movers = sorted(misplaced, key=lambda i: regions[i])
    # dest[p]: where the request now at position p must end up.
    dest = dict(zip(movers, misplaced, strict=True))
    for start in misplaced:
        while (to := dest[start]) != start:
            state.swap_states(start, to)
            dest[start], dest[to] = dest[to], to
    return True
