"""A step's inputs at fixed addresses, and how host values reach them.

Two ways in, both at fixed addresses (DESIGN.md, Lifecycle 4):

* small per-step vectors (query start locations, sequence lengths, slot mapping) are written
  by the host into the staging block (pinned on CUDA), real values only, with the real counts;
  the staging kernels, the first nodes of a captured step, read them straight from pinned
  memory, pad to the step's static extent on the device and derive ``positions``,
  ``token_to_req`` and the decode/prefill split (:mod:`staticattn.kernels.staging.stage_inputs`);
* large persistent state (the block tables) lives only in device views that the engine
  updates in place, the rows that changed; no step copies a whole table.

The host never rewrites staging that an in-flight step may still read: the last staging
kernel to read it is followed by an event (recorded inside the graph too, as an event node),
and every writer waits on it first (:meth:`StepInputs.wait_staging_free`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from staticattn.arena.config import ArenaConfig
from staticattn.arena.groups import cache_groups
from staticattn.kernels.runtime.backend import resolve_backend
from staticattn.kernels.runtime.compiled_launch import record_event
from staticattn.kernels.staging.pinned_staging import PinnedStaging
from staticattn.kernels.staging.stage_inputs import (
    StagingViews,
    stage_device,
    stage_general,
    stage_replay_start,
    stage_uniform,
)
from staticattn.staging.host_views import HostViews
from staticattn.staging.input_buffers import PAD_SLOT_ID
from staticattn.staging.pinned_counts import PinnedCounts
from staticattn.staging.span_block import ImageSpans
from staticattn.validation.extents import check_extents
from staticattn.validation.image_spans import check_image_spans
from staticattn.validation.replay_start import check_replay_start

__all__ = ["ExtentViews", "StagedCounts", "StepInputs"]


@dataclass(frozen=True, slots=True)
class StagedCounts:
    """What :meth:`StepInputs.stage` wrote: real and padded extents, host maxima."""

    num_reqs: int
    num_tokens: int
    num_reqs_padded: int
    num_tokens_padded: int
    max_query_len: int
    max_seq_len: int


class ExtentViews(NamedTuple):
    """The input views cut to ``num_reqs`` requests and ``num_tokens`` tokens."""

    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    positions: torch.Tensor
    token_to_req: torch.Tensor
    swa_block_table: torch.Tensor | None
    query_lens: torch.Tensor
    block_tables: dict[str, torch.Tensor]
    replay_start: torch.Tensor | None = None


class StepInputs:
    """The arena's input views and the staging of host values into them.

    Parameters
    ----------
    arena : Arena
        Allocated, with :func:`~staticattn.staging.input_buffers` declared.

    Attributes
    ----------
    query_start_loc, seq_lens, slot_mapping, positions, token_to_req, block_table,
    swa_block_table, step_counts, query_lens, replay_start : torch.Tensor
        Device views (``swa_block_table`` is None without SWA, ``replay_start`` without
        bounded replay; ``step_counts``, ``query_lens`` and ``replay_start`` are written by
        the staging kernels).
    block_tables : dict of str to torch.Tensor
        The block table of every cache group with one of its own, by group name
        (``"c2a.index_k"``, :func:`~staticattn.arena.cache_groups`), int32 device
        ``(max_num_seqs, columns)``; empty for DeepSeek V3.2 and V4. The engine updates
        them in place, like ``block_table``.
    host_query_start_loc, host_seq_lens, host_slot_mapping, host_counts,
    host_replay_start : torch.Tensor
        Host staging views; the eager path reads its host-side lengths from them.
    host : HostViews
        The same host memory as numpy arrays (no torch dispatch per write).
    """

    def __init__(self, arena) -> None:
        self.config: ArenaConfig = arena.config
        self.device = arena.device
        self.backend = resolve_backend(self.config.kernel_backend, self.device)
        self.query_start_loc = arena["input.query_start_loc"]
        self.seq_lens = arena["input.seq_lens"]
        self.slot_mapping = arena["input.slot_mapping"]
        self.positions = arena["input.positions"]
        self.token_to_req = arena["input.token_to_req"]
        self.step_counts = arena["input.step_counts"]
        self.query_lens = arena["input.query_lens"]
        self.block_table = arena["input.block_table"]
        self.swa_block_table = (
            arena["input.swa_block_table"] if "input.swa_block_table" in arena else None
        )
        self.block_tables = {g.name: arena[f"input.block_tables.{g.name}"]
                             for g in cache_groups(self.config)}
        self.host_query_start_loc = arena["staging.query_start_loc"]
        self.host_seq_lens = arena["staging.seq_lens"]
        self.host_slot_mapping = arena["staging.slot_mapping"]
        self.host_counts = arena["staging.counts"]
        replay = "input.replay_start" in arena
        self.replay_start = arena["input.replay_start"] if replay else None
        self.host_replay_start = arena["staging.replay_start"] if replay else None
        #: The image spans' block (:mod:`staticattn.staging.span_block`), None for text models.
        self.images = ImageSpans(arena["staging.image_spans"], arena["input.image_spans"]) \
            if "input.image_spans" in arena else None
        #: The one writer of the pinned counts the staging kernels read.
        self.counts = PinnedCounts(self.host_counts.numpy(),
                                   0 if self.images is None else self.images.capacity)
        pinned = PinnedStaging(
            self.host_query_start_loc, self.host_seq_lens, self.host_slot_mapping,
            self.host_counts, self.host_replay_start,
            None if self.images is None else self.images.host,
        )
        self.host = HostViews(*(None if view is None else view.numpy() for view in pinned))
        self._views = StagingViews(
            pinned, self.query_start_loc, self.seq_lens, self.slot_mapping, self.positions,
            self.token_to_req, self.step_counts, self.query_lens,
            None if self.images is None else self.images.device,
        )
        self._consumed = (
            torch.cuda.Event(external=True) if self.device.type == "cuda" else None
        )
        self._extent_views: dict[tuple[int, int], ExtentViews] = {}
        #: The views went out to an engine for an in-place step not yet launched (set by
        #: the graph manager's ``begin_step``; any writer's wait for the staging ends it).
        self.handed_out = False

    def views(self, num_reqs: int, num_tokens: int) -> ExtentViews:
        """The input views cut to an extent; cut once per extent and kept (slicing a tensor
        costs over a microsecond, and the same few extents come back step after step)."""
        key = (num_reqs, num_tokens)
        views = self._extent_views.get(key)
        if views is None:
            if len(self._extent_views) > 4096:
                self._extent_views.clear()
            swa, replay = self.swa_block_table, self.replay_start
            views = self._extent_views[key] = ExtentViews(
                self.query_start_loc[: num_reqs + 1], self.host_query_start_loc[: num_reqs + 1],
                self.seq_lens[:num_reqs], self.host_seq_lens[:num_reqs],
                self.block_table[:num_reqs], self.slot_mapping[:num_tokens],
                self.positions[:num_tokens], self.token_to_req[:num_tokens],
                None if swa is None else swa[:num_reqs], self.query_lens[:num_reqs],
                {name: table[:num_reqs] for name, table in self.block_tables.items()},
                None if replay is None else replay[:num_reqs],
            )
        return views

    # ----------------------------------------------------------------- host side
    def stage(
        self,
        query_lens: np.ndarray,
        seq_lens: np.ndarray,
        slot_mapping: np.ndarray,
        *,
        num_reqs_padded: int | None = None,
        num_tokens_padded: int | None = None,
        checked: bool = False,
        replay_start: np.ndarray | None = None,
        image_spans=None,
    ) -> StagedCounts:
        """Write one step's host values into the staging block, with its padding.

        Waits until the previous step's staging kernel has read the staging block (a no-op
        on CPU, and nearly always already true on CUDA), then writes. Raises
        :class:`CapacityError` / :class:`InvalidBatchError` before writing anything when
        the extents do not fit the staging block; the checks of the values themselves
        (sequence vs query lengths, ``max_model_len``, slots, decode-first order) are
        :func:`staticattn.validation.host_arrays.validate_host_step`'s, which
        :class:`~staticattn.graphs.GraphManager` runs first.

        Parameters
        ----------
        query_lens : int array ``(num_reqs,)``
            Tokens scheduled per request this step.
        seq_lens : int array ``(num_reqs,)``
            Context + scheduled tokens per request.
        slot_mapping : int array ``(num_tokens,)``
            KV slot per token, ``-1`` = do not write.
        num_reqs_padded, num_tokens_padded : int, optional
            Pad to these extents with null requests (query length 0, sequence length 0;
            spec §10.5) and null tokens (slot -1). The device views are padded by the
            staging kernel; the host views are padded here too, for eager planning, which
            reads them.
        checked : bool
            The caller has checked the arrays and extents (the graph manager's validation):
            skip the checks of the extents.
        replay_start : int array ``(num_reqs,)``, optional
            Bounded replay (``docs/spec/deepseek-v41.md`` §8.1): each request's first
            replayed position, ``0 <= replay_start <= seq_lens - query_lens``, 0 for the
            decodes (:func:`~staticattn.validation.replay_start.check_replay_start`); only prefill
            requests' values reach the device (:func:`~staticattn.kernels.staging.stage_inputs.
            stage_replay_start`). None: no request replays (all 0).
        image_spans : rows of ``(request, first, last)`` or a mapping, optional
            A vision model's images (:mod:`staticattn.staging.span_block`), checked here unless
            ``checked`` (:func:`~staticattn.validation.image_spans.check_image_spans`). None: none.
        """
        query_lens = np.asarray(query_lens)
        seq_lens = np.asarray(seq_lens)
        slot_mapping = np.asarray(slot_mapping)
        num_reqs, num_tokens = int(query_lens.shape[0]), int(slot_mapping.shape[0])
        pr = num_reqs if num_reqs_padded is None else int(num_reqs_padded)
        pt = num_tokens if num_tokens_padded is None else int(num_tokens_padded)
        if not checked:
            check_extents(self.config, query_lens, seq_lens, slot_mapping, pr, pt)
            check_replay_start(self.config, replay_start, query_lens, seq_lens)
            image_spans = check_image_spans(self.config, image_spans, query_lens, seq_lens)
        self.stage_step(query_lens, seq_lens, slot_mapping, replay_start, image_spans)
        host = self.host
        if pr > num_reqs:
            host.query_start_loc[num_reqs + 1 : pr + 1] = num_tokens
            host.seq_lens[num_reqs:pr] = 0
            if host.replay_start is not None:
                host.replay_start[num_reqs:pr] = 0
        if pt > num_tokens:
            host.slot_mapping[num_tokens:pt] = PAD_SLOT_ID
        return StagedCounts(
            num_reqs=num_reqs, num_tokens=num_tokens, num_reqs_padded=pr,
            num_tokens_padded=pt,
            max_query_len=int(query_lens.max()) if num_reqs else 0,
            max_seq_len=int(seq_lens.max()) if num_reqs else 0,
        )

    def stage_step(self, query_lens: np.ndarray, seq_lens: np.ndarray,
                   slot_mapping: np.ndarray, replay_start: np.ndarray | None = None,
                   image_spans: list[tuple[int, int, int]] | None = None) -> None:
        """:meth:`stage` for a step a graph will pad: the real query starts, lengths, slots
        and counts only (no padding, no maxima, no checks: the caller has checked). Host
        ints: ``query_lens``, ``seq_lens`` ``(num_reqs,)``, ``slot_mapping``
        ``(num_tokens,)``, ``replay_start`` ``(num_reqs,)`` or None (all 0), written only
        where the arena has bounded replay."""
        num_reqs, num_tokens = query_lens.shape[0], slot_mapping.shape[0]
        self.wait_staging_free()
        host = self.host
        host.query_start_loc[0] = 0
        # The ufunc itself: ``np.cumsum`` adds a Python wrapper around it.
        np.add.accumulate(query_lens, out=host.query_start_loc[1 : num_reqs + 1])
        host.seq_lens[:num_reqs] = seq_lens
        host.slot_mapping[:num_tokens] = slot_mapping
        if host.replay_start is not None:
            host.replay_start[:num_reqs] = 0 if replay_start is None else replay_start
        num_spans = 0 if self.images is None else self.images.stage(image_spans)
        self.counts.step(num_reqs, num_tokens, num_spans)

    def stage_uniform_decode(self, seq_lens: np.ndarray, slot_mapping: np.ndarray) -> None:
        """:meth:`stage` for a uniform decode step that a graph will pad: every request
        schedules ``next_n`` tokens, so only the sequence lengths, the slots and the request
        count are written (no query starts, no padding, no maxima).

        The caller has checked the step and its extents (the graph manager's pre-screen).
        Host ints: ``seq_lens`` ``(num_reqs,)``, ``slot_mapping`` ``(num_reqs * next_n,)``.
        """
        num_reqs = seq_lens.shape[0]
        self.wait_staging_free()
        host = self.host
        host.seq_lens[:num_reqs] = seq_lens
        host.slot_mapping[: slot_mapping.shape[0]] = slot_mapping
        self.counts.uniform(num_reqs)

    def stage_device_step(self, num_reqs: int, replay_start: np.ndarray | None = None) -> None:
        """The host half of a step whose query starts, lengths and slots an earlier kernel
        writes on the device: the request count ``k`` (its extent is checked by the caller)
        and, with bounded replay, each request's ``replay_start`` (host ints ``(k,)``, read
        for the prefill requests only; None: all 0)."""
        self.wait_staging_free()
        host = self.host
        if host.replay_start is not None:
            host.replay_start[:num_reqs] = 0 if replay_start is None else replay_start
        self.counts.uniform(num_reqs)
        self.counts.spans(0)  # the producer's steps carry no spans

    @property
    def staging_events(self) -> tuple[torch.cuda.Event, ...]:
        """The event the writers wait for (:meth:`wait_staging_free`), none on CPU."""
        return () if self._consumed is None else (self._consumed,)

    def wait_staging_free(self) -> None:
        """Block until the last staging kernel has read the staging block. A query first:
        the event has nearly always fired, and asking is cheaper than synchronising. The
        caller is about to write the staging: views handed out for an in-place step are no
        longer that step's (``handed_out`` ends)."""
        self.handed_out = False
        if self._consumed is not None and not self._consumed.query():
            self._consumed.synchronize()

    # --------------------------------------------------------------- device side
    def copy_to_device(self, num_reqs: int, num_tokens: int, *, uniform: bool = False,
                       device_starts: bool = False, mark: bool = True) -> None:
        """Launch the staging kernels over a static extent, then mark the staging free
        (unless ``mark`` is False: the caller marks it later, :meth:`mark_staging_read`).

        Graph-safe: the extent is static, the real counts are read by the kernels from the
        staging, and inside a capture the event becomes an event-record node that fires on
        every replay. ``uniform=True`` promises that every real request schedules
        ``next_n`` tokens (``num_tokens = num_reqs * next_n``; what a decode graph replays),
        which stages in one kernel that finds each token's request by division.
        ``device_starts=True``: the device views ``query_start_loc[: k + 1]``,
        ``seq_lens[:k]`` and ``slot_mapping[:nt]`` were written on the device (an earlier
        kernel of the same stream), only ``k`` (and the replay starts) on the host
        (:meth:`stage_device_step`); they are padded in place and ``nt =
        min(query_start_loc[k], num_tokens)``. With bounded replay every step but a uniform
        one then stages ``replay_start`` from the host for the prefill requests of the
        device's split (the host wrote 0s where a step replays nothing).
        """
        if device_starts:
            stage_device(self.backend, self._views, num_reqs, num_tokens,
                         self.config.decode_threshold)
        elif uniform:
            stage_uniform(self.backend, self._views, num_reqs, self.config.next_n)
        else:
            stage_general(self.backend, self._views, num_reqs, num_tokens,
                          self.config.decode_threshold)
        if self.replay_start is not None and not uniform:
            # After the split (the kernel reads D); uniform steps are decodes and their
            # batches carry no replay_start (Batch.for_decode_capture).
            stage_replay_start(self.backend, self.host_replay_start, self.step_counts,
                               self.replay_start, num_reqs)
        if self.images is not None and device_starts:
            # The general staging copies the span block; the device-starts path has no
            # copy kernel, and its steps carry no spans.
            self.images.clear_device()
        if mark:
            self.mark_staging_read()

    def mark_staging_read(self) -> None:
        """Record the guard's event on the current stream (an event-record node inside a
        capture): once it fires, every staging kernel launched before it has read the
        staging, and :meth:`wait_staging_free` returns."""
        if self._consumed is not None:
            record_event(self._consumed)
