"""The array part of :class:`~staticattn.graphs.GraphManager`: a step handed as host
arrays (``run(query_lens, seq_lens, slot_mapping)``, with DeepSeek V4.1's ``replay_start``)
is checked, written into the staging and replayed through the smallest graph that holds it,
else run eagerly and counted."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from staticattn.errors import GraphError, InvalidBatchError
from staticattn.graphs.captured import CapturedGraph, GraphKind, RunResult, RunStats
from staticattn.graphs.eager import EagerSteps
from staticattn.graphs.options import EagerBuild, GraphOptions
from staticattn.graphs.pool import GraphPool
from staticattn.graphs.table import GraphTable
from staticattn.staging import StepInputs, check_image_spans, check_replay_start
from staticattn.validation.block_ids import BlockIds
from staticattn.validation.extents import check_extents
from staticattn.validation.host_arrays import (
    screen_step,
    uniform_decode_passes,
    validate_host_step,
)

__all__ = ["StepRunner"]

_GRAPH, _DECODE = EagerBuild.GRAPH, GraphKind.DECODE


class StepRunner:
    """Steps handed as host arrays, for one manager.

    Takes the inputs, the manager's :class:`~staticattn.graphs.table.GraphTable`,
    :class:`~staticattn.graphs.captured.RunStats`, :class:`~staticattn.graphs.eager.
    EagerSteps` and :class:`~staticattn.graphs.pool.GraphPool` (its replay stream carries
    the timing events), the slot bound, the block ids' checks (:class:`~staticattn.builders.
    validation.blocks.BlockIds`, or None) and the options (``validate``, ``time_gpu``,
    ``num_kv_blocks``). Owns ``validate`` and ``time_gpu`` (switchable through the manager)
    and ``closed`` (set by :meth:`close`: every later step is refused). Offers :meth:`run`,
    :meth:`stage_for_graph`, :meth:`close` and :meth:`require_open`.
    """

    def __init__(self, inputs: StepInputs, table: GraphTable, stats: RunStats,
                 eager: EagerSteps, pool: GraphPool, slot_bound: int | None,
                 block_ids: BlockIds | None, options: GraphOptions) -> None:
        self.inputs, self.config = inputs, inputs.config
        self.table, self.stats, self.eager, self._pool = table, stats, eager, pool
        self.slot_bound = slot_bound
        # The block ids a validated step uses, where the tables are host memory (a CPU
        # arena; None otherwise: reading a device table would synchronise).
        self._host_blocks = block_ids if block_ids is not None and block_ids.host_tables \
            else None
        self.validate = options.validate
        self.time_gpu = options.time_gpu and inputs.device.type == "cuda"
        self.closed = False
        self._num_kv_blocks = options.num_kv_blocks
        self._eager_build = eager.build
        self._graph_builds = eager.build is _GRAPH
        self._n = self.config.next_n
        self._decode_queries: dict[tuple[int, np.dtype], bytes] = {}

    def close(self) -> None:
        """Refuse every later step with a :class:`GraphError`."""
        self.closed = True

    def require_open(self) -> None:
        """Raise :class:`GraphError` once closed."""
        if self.closed:
            raise GraphError("the GraphManager is closed; create a new one to capture or run")

    def run(
        self,
        query_lens: Sequence[int] | np.ndarray,
        seq_lens: Sequence[int] | np.ndarray,
        slot_mapping: Sequence[int] | np.ndarray,
        *,
        replay_start: Sequence[int] | np.ndarray | None = None,
        image_spans=None,
        eager: EagerBuild | None = None,
    ) -> RunResult:
        """Run one step: replay the graph that holds it, else eagerly.

        Parameters
        ----------
        query_lens, seq_lens : int ``(num_reqs,)``
            Decodes first (the batch is reordered decode -> extend -> prefill).
        slot_mapping : int64 ``(num_tokens,)``
            -1 = do not write.
        replay_start : int ``(num_reqs,)``, optional
            Bounded replay (an architecture with it: DeepSeek V4.1,
            ``docs/spec/deepseek-v41.md`` §8.1): each prefill request's first replayed
            position after a prefix hit, ``0 <= replay_start <= seq_lens - query_lens``; 0
            for the decodes. Staged like the other step inputs (a graph reads it from the
            staging, captured with 0s). None: no request replays. Checked whenever given
            (:func:`~staticattn.validation.replay_start.check_replay_start`), before anything is
            written.
        image_spans : rows of ``(request, first, last)`` or a mapping ``request ->
            [(first, last), ...]``, optional
            DeepSeek V4's vision variant (``max_image_tokens > 0``,
            ``vllm-0.33-extras.md`` §3): positions ``first .. last`` of a request form one
            image, seen bidirectionally by its prefill tokens. Staged like the other inputs;
            checked whenever given (:func:`~staticattn.validation.image_spans.check_image_spans`:
            capacity, within the request, no overlap, at most ``W + mit`` tokens), before
            anything is written. None: no spans.
        eager : EagerBuild, optional
            Run eagerly through these builds even if a graph could replay the step (A/B
            checks, benchmarks), counted under the reason "forced".

        Returns
        -------
        RunResult
            ``outputs`` sliced to the real tokens; valid until the next step.
        """
        if self.closed:
            self.require_open()
        q = np.asarray(query_lens)
        s = np.asarray(seq_lens)
        slots = np.asarray(slot_mapping)
        n = self._n
        # Replay path first, kept to a handful of numpy calls: it runs every decode step.
        k = q.shape[0] if q.ndim == 1 else 0
        table = self.table.decode
        # O(1) tests first: a step whose token count is not k * next_n is not uniform. Then
        # the query lengths against k * [next_n] in their dtype, byte for byte: one memcmp,
        # cheaper than ``(q == n).all()``'s reduction.
        if ((eager is None or eager is _GRAPH) and replay_start is None
                and image_spans is None and 0 < k < len(table)
                and slots.shape[0] == k * n and q.dtype.kind in "iu" and q.tobytes() == (
                    self._decode_queries.get((k, q.dtype)) or self._decode_query(k, q.dtype))
                and (
                    uniform_decode_passes(k, s, slots, self.config, self.slot_bound)
                    if self.validate else self._uniform_extents(k, s))):
            if self._host_blocks is not None and self.validate:
                self._host_blocks.check_step(k, s)
            g = None if eager else table[k]
            if g is not None:
                self.inputs.stage_uniform_decode(s, slots)
                return self._replay(g, k * n)
            if eager or self._graph_builds:  # no decode graph: a bucket, or eager
                g, reason = (None, "forced") if eager else self.table.pick(k, k * n, True, n)
                if g is not None:  # every sequence >= next_n: a bucket holds the step
                    self.stage_for_graph(q, s, slots, False)
                    return self._replay(g, k * n)
                self.inputs.stage_uniform_decode(s, slots)
                return self._eager_graph_build(k, k * n, True, reason)
        return self._run_general(q, s, slots, eager, replay_start, image_spans)

    def _decode_query(self, num_reqs: int, dtype: np.dtype) -> bytes:
        """The bytes of ``num_reqs`` query lengths of ``next_n`` in ``dtype`` (byte order
        included), kept per count and dtype: a uniform decode step's ``query_lens``."""
        pattern = self._decode_queries[(num_reqs, dtype)] = np.full(
            num_reqs, self._n, dtype=dtype).tobytes()
        return pattern

    def _uniform_extents(self, num_reqs: int, s: np.ndarray) -> bool:
        """Without validation, what still bounds every kernel of a uniform decode step:
        ``seq_lens`` as long as the query lengths and ``k * next_n`` tokens in capacity."""
        return (s.ndim == 1 and s.shape[0] == num_reqs
                and num_reqs * self._n <= self.config.max_num_batched_tokens)

    def _run_general(self, q, s, slots, eager: EagerBuild | None,
                     replay_start=None, image_spans=None) -> RunResult:
        """Every step the decode replay path did not take: check, then replay the graph
        that holds it, or run eagerly."""
        if eager is not None and not isinstance(eager, EagerBuild):
            raise GraphError(f"eager must be None, EagerBuild.GRAPH or EagerBuild.REFERENCE; "
                             f"got {eager!r}")
        if q.ndim == 1 and q.shape[0] == 0:
            raise InvalidBatchError("a step needs at least one request; got none")
        cfg = self.config
        lengths = screen_step(q, s, slots, cfg, self.slot_bound) if self.validate else None
        if lengths is None:
            if self.validate:
                validate_host_step(q, s, slots, cfg, require_decode_first=True,
                                   num_kv_blocks=self._num_kv_blocks,
                                   decode_threshold=cfg.decode_threshold)
            lengths = int(q.min()), int(q.max())
        if replay_start is not None:
            replay_start = np.asarray(replay_start)
            check_replay_start(cfg, replay_start, q, s)
        spans = check_image_spans(cfg, image_spans, q, s)
        k, num_tokens = int(q.shape[0]), int(slots.shape[0])
        if self._host_blocks is not None and self.validate:
            self._host_blocks.check_step(k, s)
        shortest, longest = lengths
        uniform = longest == self._n == shortest
        if eager is not None:
            g, reason = None, "forced"
        else:
            g, reason = self.table.pick(k, num_tokens, uniform, longest)
        if g is not None:
            self.stage_for_graph(q, s, slots, g.kind is _DECODE, replay_start, spans)
            return self._replay(g, num_tokens)
        if (eager or self._eager_build) is _GRAPH:
            if not self.validate:  # the extents still bound every kernel
                check_extents(cfg, q, s, slots, k, num_tokens)
            self.stage_for_graph(q, s, slots, uniform, replay_start, spans)
            return self._eager_graph_build(k, num_tokens, uniform, reason)
        counts = self.inputs.stage(q, s, slots, checked=self.validate,
                                   replay_start=replay_start, image_spans=spans)
        events = self._record_start()
        outputs = self.eager.reference_builds(counts)
        self._record_end(events)
        self.stats.eager[reason] += 1
        return RunResult(outputs, "eager", None, reason, num_tokens, events)

    def stage_for_graph(self, q: np.ndarray, s: np.ndarray, slots: np.ndarray,
                        uniform: bool, replay_start: np.ndarray | None = None,
                        image_spans: list[tuple[int, int, int]] | None = None) -> None:
        """Write a checked step into the staging that a graph's staging kernels (or the
        same builds run eagerly) read: for a uniform decode step (``uniform``) the lengths,
        slots and request count only (its decodes replay nothing), else the query starts,
        token count, replay starts (None: 0s) and image spans (None: none) too. Host ints:
        ``q``, ``s``, ``replay_start`` ``(num_reqs,)``, ``slots`` ``(num_tokens,)``;
        ``image_spans`` checked ``(request, first, last)`` triples."""
        if uniform:
            self.inputs.stage_uniform_decode(s, slots)
        else:
            self.inputs.stage_step(q, s, slots, replay_start, image_spans)

    def _eager_graph_build(self, num_reqs: int, num_tokens: int, uniform: bool,
                           reason: str) -> RunResult:
        """Run a staged step through the graph builds, eagerly, counted under ``reason``."""
        events = self._record_start()
        outputs = self.eager.graph_builds(num_reqs, num_tokens, uniform)
        self._record_end(events)
        self.stats.eager[reason] += 1
        return RunResult(outputs, "eager", None, reason, num_tokens, events)

    def _replay(self, g: CapturedGraph, num_tokens: int) -> RunResult:
        events = self._record_start() if self.time_gpu else None
        g.launch()
        self.stats.count_replay(g.kind)
        if events is None:  # untimed: the graph's one result object for this count
            return g.result_for(num_tokens)
        self._record_end(events)
        return RunResult(g.outputs_for(num_tokens), "graph", g.size, None, num_tokens, events,
                         g.kind)

    def _record_start(self):
        if not self.time_gpu:
            return None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(self._pool.stream)
        return start, end

    def _record_end(self, events) -> None:
        if events is not None:
            events[1].record(self._pool.stream)
