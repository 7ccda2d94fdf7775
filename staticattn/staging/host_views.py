"""The pinned staging as numpy views an engine writes a step into, in place.

What an integer view accepts is numpy's assignment: an integer array of any dtype is cast
to the view's (int32 for the lengths and starts, int64 for the slots) -- a value past the
view's range wraps around -- a float is truncated (``100.7`` -> ``100``) and a bool read as
0 or 1, without a word. No check after the write can tell such a value from one the engine
meant, so write integer arrays of the view's dtype (docs/embedding.md)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
