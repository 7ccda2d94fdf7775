"""The pinned staging as numpy views an engine writes a step into, in place, and the checked
writer of those views."""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np

from staticattn.errors import InvalidBatchError

__all__ = ["HostViews"]


@dataclass(frozen=True, slots=True)
class HostViews:
    """Numpy views of the pinned staging, which an engine may write in place.

    Attributes
    ----------
    query_start_loc : int32 ``(max_num_seqs + 1,)``
        ``[0, q_0, q_0 + q_1, ...]`` of the real requests (not read by uniform steps).
    seq_lens : int32 ``(max_num_seqs,)``
        Context + scheduled tokens of each real request.
    slot_mapping : int64 ``(max_num_batched_tokens,)``
        KV slot of each real token; -1 = do not write.
    counts : int32 ``(4,)``
        ``[num_reqs, num_tokens]`` of the step (the rest unused).
    replay_start : int32 ``(max_num_seqs,)`` or None
        With bounded replay (``docs/spec/deepseek-v41.md`` §8.1): each request's first
        replayed position, read for prefilling requests only (decodes read 0). None for
        architectures without it.
    image_spans : int32 ``(max_image_spans, 3)`` or None
        With image spans (a vision model): rows ``(request, first, last)``, unused rows
        request -1 (:mod:`staticattn.staging.span_block`), read by steps with prefills.
    """

    query_start_loc: np.ndarray
    seq_lens: np.ndarray
    slot_mapping: np.ndarray
    counts: np.ndarray
    replay_start: np.ndarray | None = None
    image_spans: np.ndarray | None = None

    def write(self, name: str, values: np.ndarray, start: int = 0) -> None:
        """Write ``values`` into view ``name`` ("seq_lens", "slot_mapping",
        "query_start_loc", "replay_start") at ``[start : start + len(values)]``, refusing
        what a plain numpy assignment converts without a word.

        A plain ``views.seq_lens[:k] = values`` truncates floats (``100.7`` -> ``100``),
        reads bools as 0 and 1 and wraps integers past the view's dtype (int32 for the
        lengths and starts): no check after the write can tell. Here ``values`` (host ints
        ``(n,)``, any integer dtype; a list is converted first) must be integers within the
        view's dtype, else an :class:`~staticattn.errors.InvalidBatchError` names the view
        and nothing is written. Costs a dtype test on top of the assignment (and a range
        test when ``values`` is wider than the view).
        """
        try:
            view = _WRITABLE[name](self)
        except KeyError:
            view = None
        if view is None:
            raise InvalidBatchError(f"no integer view {name!r} to write; this arena has "
                                    f"{[v for v in _WRITABLE if _WRITABLE[v](self) is not None]}")
        if type(values) is not np.ndarray:
            values = np.asarray(values)
        dtype = values.dtype
        if dtype.kind not in "iu" or values.ndim != 1:
            if values.size or values.ndim != 1:
                raise InvalidBatchError(
                    f"{name} takes a 1-D array of integers; got dtype {dtype}, shape "
                    f"{values.shape} (a float would be truncated, a bool read as 0 or 1)")
        elif dtype.itemsize > view.itemsize or dtype.kind == "u" and dtype.itemsize == \
                view.itemsize:
            info = np.iinfo(view.dtype)
            if values.size and (values.item(values.argmin()) < info.min
                                or values.item(values.argmax()) > info.max):
                raise InvalidBatchError(f"{name} holds a value outside {view.dtype}; it "
                                        "would wrap around on assignment")
        view[start : start + values.shape[0]] = values


#: The views :meth:`HostViews.write` writes, and how to reach each (an attribute getter:
#: cheaper than ``getattr`` by name).
_WRITABLE = {name: operator.attrgetter(name) for name in
             ("seq_lens", "slot_mapping", "query_start_loc", "replay_start")}
