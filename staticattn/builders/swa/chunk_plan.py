"""The prefill chunk plan of the sparse sliding-window metadata (``docs/spec/
vllm-0.33-extras.md`` §2.5): how the FlashMLA prefill groups prefill requests into
workspace chunks, per layer type.

A plan is a list of ``(start, end, N, M)`` over the prefill requests ``[0, P)`` (indices
relative to the first prefill): requests ``[start, end)`` share a workspace whose block per
request is ``M = N + max gather`` rows, ``N`` of them compressed entries. With ``c_b =
L_b // R`` (0 for a type without compressed entries), ``g_b = q_b + clamp(L_b - q_b, 0, W -
1)`` and the area budget ``A = C ((cdiv(max_model_len, R) if compressed else 0) + W +
max_num_batched_tokens)``, ``C = 4``, a chunk starting at ``s`` with ``(n, g) = (c_s, g_s)``
takes request ``e`` while ``(e - s + 1) (max(n, c_e) + max(g, g_e)) <= A``. ``C`` scales an
area, it is not a request count.

The eager build plans on the host from the batch's host lengths (:func:`host_chunk_plan`,
the reference's ``get_prefill_chunk_plan``) and on the device into the arena
(:mod:`staticattn.kernels.swa.prefill_gather`); a graph build only on the device, a fixed-capacity
table and a device count. Worked example A (W = 4, ratio 4): prefills ``L = [10, 5]``,
``q = [3, 5]`` -> ``[(0, 2, 2, 8)]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from staticattn.model import LayerType

__all__ = ["PrefillChunkPlan", "host_chunk_plan"]

Chunk = tuple[int, int, int, int]


def host_chunk_plan(seq_lens: Sequence[int], query_lens: Sequence[int], ratio: int,
                    window: int, budget: int) -> list[Chunk]:
    """The greedy plan over prefill requests with host lengths ``seq_lens``, ``query_lens``
    (one per prefill request); ``ratio`` 0 counts no compressed entries; ``budget`` is
    ``A``."""
    plan: list[Chunk] = []
    start, n, g = 0, 0, 0
    for e, (length, q) in enumerate(zip(seq_lens, query_lens)):
        length, q = int(length), int(q)
        c_e = length // ratio if ratio else 0
        g_e = q + min(max(length - q, 0), window - 1)
        if e > start and (e - start + 1) * (max(n, c_e) + max(g, g_e)) > budget:
            plan.append((start, e, n, n + g))
            start, n, g = e, c_e, g_e
        elif e > start:
            n, g = max(n, c_e), max(g, g_e)
        else:
            n, g = c_e, g_e
    if start < len(seq_lens):
        plan.append((start, len(seq_lens), n, n + g))
    return plan


@dataclass(slots=True)
class PrefillChunkPlan:
    """One layer type's prefill chunk plan.

    Attributes
    ----------
    layer_type : LayerType
        The type planned for; its compressed entries count when it reads any.
    ratio : int
        The ratio the plan counts entries by (0: none, ``has_compressed`` false).
    chunks : int32 device ``(C, 4)``
        Row ``c < num_chunks``: ``(start, end, N, M)``, request indices relative to the
        first prefill; rows past the count 0. ``C = max_num_seqs``.
    num_chunks : int32 device ``(1,)``
        The plan's chunk count.
    host : list of (int, int, int, int) or None
        The same plan on the host, from an eager build (the reference's
        ``get_prefill_chunk_plan``); None from a graph build, whose composition only the
        device knows.
    """

    layer_type: LayerType
    ratio: int
    chunks: torch.Tensor
    num_chunks: torch.Tensor
    host: list[Chunk] | None = None
