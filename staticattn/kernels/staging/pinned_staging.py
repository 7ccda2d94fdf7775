"""The pinned staging block's per-step views: one record for the numpy views an engine writes
(:class:`~staticattn.staging.host_views.HostViews`) and the tensors the staging kernels read
(:class:`~staticattn.kernels.staging.stage_inputs.StagingViews`), over the same memory."""

from __future__ import annotations

from typing import Generic, NamedTuple, TypeVar

__all__ = ["PinnedStaging"]

#: The array type of the views: ``torch.Tensor`` for the kernels, ``np.ndarray`` for an engine.
A = TypeVar("A")


class PinnedStaging(NamedTuple, Generic[A]):
    """The pinned staging of one step, real values only (the staging kernels pad).

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

    query_start_loc: A
    seq_lens: A
    slot_mapping: A
    counts: A
    replay_start: A | None = None
    image_spans: A | None = None
