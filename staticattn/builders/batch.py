"""The batch every builder reads: our counterpart of the reference engine's common
attention metadata (spec §2).

A :class:`Batch` is a set of views plus static ints. When it comes from the arena
(:meth:`Batch.from_inputs`) every tensor is an arena view, so its addresses never change.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from staticattn.errors import InvalidBatchError
from staticattn.model import Addressing, Cache, LayerType
from staticattn.staging.inputs import StagedCounts, StepInputs

__all__ = ["Batch"]


@dataclass(slots=True)
class Batch:
    """One step's attention inputs.

    Attributes
    ----------
    query_start_loc : int32 device ``(num_reqs + 1,)``
        Prefix sums of query lengths; ``qsl[0] = 0``, non-decreasing. Padded requests
        repeat the real token count (query length 0).
    query_start_loc_cpu : int32 host ``(num_reqs + 1,)``
        The same values on the host (eager planning reads these, never the device).
    seq_lens : int32 device ``(num_reqs,)``
        Context + scheduled tokens per request (``L_b``); padded requests have 0.
    seq_lens_cpu : int32 host ``(num_reqs,)``
        Host copy of ``seq_lens``; an upper bound (exact for prefill rows).
    num_reqs : int
        Requests, padded ones included.
    num_actual_tokens : int
        Tokens, padded ones included (as the reference's FULL-graph mode counts them).
    max_query_len, max_seq_len : int
        Maxima over the real requests; a batch built for capture
        (:meth:`for_decode_capture`) carries their capacities instead (``next_n`` and
        ``max_model_len``), never values read from data.
    block_table : int32 device ``(num_reqs, max_blocks_per_req)``
        Main cache group (indexer / compressed caches), ``block_size`` tokens per block.
    slot_mapping : int64 device ``(num_actual_tokens,)``
        Uncompressed KV slot per token in the SWA group if the model has one, else in the
        main group; ``-1`` = do not write (padded tokens are always -1).
    positions : int64 device ``(num_actual_tokens,)`` or None
        Absolute position per token; padded tokens 0.
    token_to_req : int32 device ``(num_actual_tokens,)`` or None
        Request of each token; padded tokens 0.
    swa_block_table : int32 device ``(num_reqs, max_swa_blocks_per_req)`` or None
        SWA cache group, ``swa_block_size`` tokens per block.
    dcp_local_seq_lens : int32 device ``(num_reqs,)`` or None
        Context-parallel local lengths, when used.
    is_prefilling : bool host ``(num_reqs,)`` or None
        Requests still processing their prompt (for the split's short-extend rule).
    step_counts : int32 device ``(4,)`` or None
        ``[num_reqs, num_tokens, num_decodes, num_decode_tokens]`` of the real step, derived
        by the staging kernel (:mod:`staticattn.kernels.staging.stage_inputs`): what a build for a
        step of any composition (:meth:`for_mixed_capture`) reads instead of host values.
    query_lens : int32 device ``(num_reqs,)`` or None
        Each request's query length, derived by the staging kernel (0 for padding).
    replay_start : int32 device ``(num_reqs,)`` or None
        Bounded replay (``docs/spec/deepseek-v41.md`` §8.1): each prefill request's first
        replayed position, which clamps its sliding windows; 0 for decodes and padded
        requests (the staging writes it after the split). None where the architecture has
        no bounded replay, and in a uniform decode batch (:meth:`for_decode_capture`), where
        no request replays.
    image_spans : int32 device ``(max_image_spans, 3)`` or None
        Image spans (``vllm-0.33-extras.md`` §3): rows ``(request, first, last)``, unused
        rows request -1 (:mod:`staticattn.staging.span_block`); they widen the windows of the
        prefill tokens inside them. None for text models and uniform decode batches.
    block_tables : dict of str to int32 device ``(num_reqs, columns)``, or None
        The tables of the cache groups with tables of their own, by group name
        (``"c2a.index_k"``; :func:`~staticattn.arena.cache_groups`): DeepSeek V4.1's.
    """

    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    positions: torch.Tensor | None = None
    token_to_req: torch.Tensor | None = None
    swa_block_table: torch.Tensor | None = None
    dcp_local_seq_lens: torch.Tensor | None = None
    is_prefilling: torch.Tensor | None = None
    step_counts: torch.Tensor | None = None
    query_lens: torch.Tensor | None = None
    replay_start: torch.Tensor | None = None
    block_tables: dict[str, torch.Tensor] | None = None
    image_spans: torch.Tensor | None = None
    #: :meth:`host_arrays`, once computed; not an argument, and not carried over by
    #: ``dataclasses.replace`` (a replaced batch recomputes it).
    _host: tuple[np.ndarray, np.ndarray, np.ndarray] | None = field(
        default=None, init=False, repr=False, compare=False)

    @property
    def device(self) -> torch.device:
        return self.query_start_loc.device

    def require_step_counts(self) -> torch.Tensor:
        """``step_counts`` (int32 device ``(NUM_COUNTS,)``: ``[k, nt, ...]`` of the real
        step), what a build for a step of any composition reads; a typed error for a batch
        without them."""
        if self.step_counts is None:
            raise InvalidBatchError(
                "build_mixed reads the step's counts on the device (batch.step_counts); "
                "build the batch with Batch.for_mixed_capture"
            )
        return self.step_counts

    def table_of(self, layer_type: LayerType, cache: Cache) -> torch.Tensor:
        """The block table addressing ``cache`` of ``layer_type`` (int32 device
        ``(num_reqs, columns)``): its group's under :attr:`Addressing.OWN_GROUPS`, else the
        main ``block_table``."""
        if layer_type.addressing is Addressing.MAIN_TABLE:
            return self.block_table
        tables = self.block_tables or {}
        name = layer_type.group(cache)
        if name not in tables:
            raise InvalidBatchError(
                f"the batch has no block table of cache group {name!r}; build it from an "
                "arena whose config has that layer type (Batch.from_inputs)"
            )
        return tables[name]

    def host_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(query_start_loc, query_lens, seq_lens)`` of the host copies as numpy arrays,
        int32 ``(num_reqs + 1,)``, ``(num_reqs,)``, ``(num_reqs,)``: computed once per batch, for
        every planning step that reads them (the split of each builder, layouts, chunks)."""
        if self._host is None:
            qsl = self.query_start_loc_cpu.numpy()[: self.num_reqs + 1]
            self._host = (qsl, np.diff(qsl), self.seq_lens_cpu.numpy()[: self.num_reqs])
        return self._host

    @classmethod
    def from_inputs(
        cls, inputs: StepInputs, num_reqs: int, num_tokens: int, max_query_len: int,
        max_seq_len: int,
    ) -> Batch:
        """Arena views over ``num_reqs`` requests and ``num_tokens`` tokens (padding included)."""
        v = inputs.views(num_reqs, num_tokens)
        return cls(v.query_start_loc, v.query_start_loc_cpu, v.seq_lens, v.seq_lens_cpu,
                   num_reqs, num_tokens, max_query_len, max_seq_len, v.block_table,
                   v.slot_mapping, v.positions, v.token_to_req, v.swa_block_table,
                   step_counts=inputs.step_counts, query_lens=v.query_lens,
                   replay_start=v.replay_start, block_tables=v.block_tables,
                   image_spans=None if inputs.images is None else inputs.images.device)

    @classmethod
    def from_staged(cls, inputs: StepInputs, counts: StagedCounts) -> Batch:
        """The batch a :meth:`StepInputs.stage` call described (padded extents)."""
        return cls.from_inputs(
            inputs, counts.num_reqs_padded, counts.num_tokens_padded, counts.max_query_len,
            counts.max_seq_len,
        )

    @classmethod
    def for_decode_capture(cls, inputs: StepInputs, num_reqs: int,
                           max_seq_len: int | None = None) -> Batch:
        """The static uniform-decode batch a graph of ``num_reqs`` requests is captured for:
        ``next_n`` tokens per request, maxima at their capacities (never read from data).
        ``max_seq_len``: the longest sequence the graph will serve (a context bucket's
        bound, default ``max_model_len``); a consumer may size its work by it."""
        cfg = inputs.config
        batch = cls.from_inputs(
            inputs, num_reqs, num_reqs * cfg.next_n, cfg.next_n,
            cfg.max_model_len if max_seq_len is None else max_seq_len,
        )
        batch.replay_start = None  # every request decodes: nothing replays
        batch.image_spans = None  # and no decode row reads a span
        return batch

    @classmethod
    def for_mixed_capture(cls, inputs: StepInputs, num_reqs: int, num_tokens: int) -> Batch:
        """The static batch a graph of a token bucket is captured for: up to ``num_reqs``
        requests and ``num_tokens`` tokens of any composition. The real counts and the split
        are only on the device (``step_counts``); the maxima are the capacities."""
        return cls.from_inputs(
            inputs, num_reqs, num_tokens, num_tokens, inputs.config.max_model_len
        )
