"""What the sparse sliding-window builder hands the step: views and static ints only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from staticattn.builders.swa.chunk_plan import PrefillChunkPlan
from staticattn.builders.swa.dense_prefill import DensePrefillChunks

__all__ = ["SparseSWAMetadata"]


@dataclass(slots=True)
class SparseSWAMetadata:
    """DeepSeek V4 / V4.1 sparse sliding-window metadata of one step (spec §6.3, plus the
    dense type's §7; the paged prefill rows and chunk plans of
    ``docs/spec/vllm-0.33-extras.md`` §2; V4.1's bounded replay,
    ``docs/spec/deepseek-v41.md`` §7.4, §8.1).

    Every tensor is an arena view (or a view of the batch's inputs), so a captured step reads
    the same addresses on every replay. ``T`` = tokens of the step (padding included),
    ``Td`` / ``Tp`` = decode / prefill tokens, ``P`` = prefill requests, ``W`` = window,
    ``maxC`` = :attr:`ArenaConfig.dense_width`. The ``dense_*`` fields serve the dense layer
    type, the one whose row reads every complete compressed entry
    (:attr:`ArenaConfig.dense_layer_type`, ``Reads.ALL``; DeepSeek V4's ``c128a``), ``R``
    its compress ratio.

    Attributes
    ----------
    query_start_loc, seq_lens : int32 device ``(num_reqs + 1,)``, ``(num_reqs,)``
    query_start_loc_cpu : int32 host ``(num_reqs + 1,)``
    block_table : int32 device ``(num_reqs, max_swa_blocks_per_req)``
        The SWA group's block table.
    slot_mapping : int64 device ``(T,)``
        SWA slots; -1 = invalid token.
    block_size, window_size : int
        SWA tokens per block; ``W``.
    is_valid_token : bool device ``(T,)``
        ``slot_mapping >= 0``.
    token_to_req_indices : int32 device ``(T,)``
        Request of each token; padded tokens 0 (the reference covers only the real tokens).
    decode_swa_indices : int32 device ``(Td, 1, W)``
        Flat SWA slots of each decode token's window (the ``W`` most recent positions
        including its own), -1 past its length. Invalid tokens: a row of -1.
    decode_swa_lens : int32 device ``(Td,)``
        ``min(p + 1, W)``; 0 for invalid tokens.
    dense_decode_indices : int32 device ``(Td, 1, maxC)`` or None
        The dense top-k of each decode token: flat slots of its ``n_c = min((p + 1) // R,
        maxC)`` complete compressed entries, -1 past ``n_c``; a row of -1 for invalid
        tokens. None when the model has no dense layers. (The reference's
        ``c128a_global_decode_topk_indices``.)
    dense_decode_lens : int32 device ``(Td,)`` or None
        ``n_c``; 0 for invalid tokens. (The reference's ``c128a_decode_topk_lens``.)
    num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens : int
        The decode/prefill split, decode threshold ``next_n``. From a mixed build (any
        composition, decided on the device) they are the bucket's capacities, upper bounds
        of the real split in ``step_counts``; every view above and below then has those
        capacities as its extent, and its rows past the real split hold length 0 and -1.
    prefill_seq_lens : int32 device ``(P,)`` or None
        The prefill requests' sequence lengths (``seq_lens[num_decodes:]``); only when
        ``P > 0``.
    prefill_gather_lens : int32 device ``(P,)`` or None
        ``q + min(L - q, W - 1)`` per prefill request; only when ``P > 0``.
    dense_prefill : DensePrefillChunks or None
        The dense type's prefill rows (the reference's ``c128a_prefill_topk_indices``),
        written by the reader a chunk at a time into a fixed workspace
        (:mod:`staticattn.builders.swa.dense_prefill`): prefill row ``i``, token
        ``num_decode_tokens + i`` at position ``p``, holds the local indices ``o < n_c =
        min((p + 1) // 128, maxC)``, then -1, with its length ``n_c``. None without dense
        layers or prefills.
    prefill_swa_indices : int32 device ``(Tp, 1, Wp)`` or None
        Row ``i``, prefill token ``num_decode_tokens + i`` at position ``p`` of request
        ``b``: the flat SWA slots of positions ``start .. p``, ``start = max(p - W + 1,
        replay_start[b])``, then -1 (``Wp`` = :func:`~staticattn.builders.swa.declarations.
        prefill_swa_width`, ``W``); a row of -1 for an invalid token. None without prefills.
    prefill_swa_lens : int32 device ``(Tp,)`` or None
        ``p - start + 1``; 0 for invalid tokens.
    prefill_chunk_plans : dict of str to PrefillChunkPlan
        By windowed layer type name: the prefill chunk plan
        (:mod:`staticattn.builders.swa.chunk_plan`); empty without prefills.
    image_spans : int32 device ``(max_image_spans, 3)`` or None
        The step's image spans (``batch.image_spans``; a vision model's steps with
        prefills), which widen the prefill and combined rows' windows.
    replay_start : int32 device ``(num_reqs,)`` or None
        The batch's bounded-replay starts (0 for decodes); None without bounded replay.
    positions : int64 device ``(T,)`` or None
        The batch's token positions (the per-layer rows read them).
    split_on_device : bool
        The split is decided on the device (a mixed build): the int fields are capacities.
    tile_scheds : dict of str to tile-scheduler metadata holder or None
        By layer type name (every windowed type of the table): a fresh empty holder per
        type present in the model, None for absent types and when ``Td == 0``; see
        :mod:`staticattn.builders.swa.tile_scheduler` and :meth:`tile_sched`.
    step_counts : int32 device ``(4,)`` or None
        ``[num_reqs, num_tokens, num_decodes, num_decode_tokens]`` of the real step, from
        the staging kernel.
    """

    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    block_size: int
    window_size: int
    is_valid_token: torch.Tensor
    token_to_req_indices: torch.Tensor
    decode_swa_indices: torch.Tensor
    decode_swa_lens: torch.Tensor
    dense_decode_indices: torch.Tensor | None
    dense_decode_lens: torch.Tensor | None
    num_decodes: int
    num_prefills: int
    num_decode_tokens: int
    num_prefill_tokens: int
    prefill_seq_lens: torch.Tensor | None = None
    prefill_gather_lens: torch.Tensor | None = None
    dense_prefill: DensePrefillChunks | None = None
    tile_scheds: dict[str, Any] = field(default_factory=dict)
    step_counts: torch.Tensor | None = None
    prefill_swa_indices: torch.Tensor | None = None
    prefill_swa_lens: torch.Tensor | None = None
    prefill_chunk_plans: dict[str, PrefillChunkPlan] = field(default_factory=dict)
    replay_start: torch.Tensor | None = None
    image_spans: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    split_on_device: bool = False

    def tile_sched(self, layer_type: str) -> Any:
        """The tile-scheduler metadata holder of ``layer_type`` (a windowed type's name:
        "swaonly", "c4a", "c128a")."""
        if layer_type not in self.tile_scheds:
            raise KeyError(f"unknown layer type {layer_type!r}; expected one of "
                           f"{list(self.tile_scheds)}")
        return self.tile_scheds[layer_type]
