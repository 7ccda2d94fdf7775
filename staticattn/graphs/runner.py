"""The array front end of :class:`~staticattn.graphs.GraphManager`: a step handed as host
arrays (``run(query_lens, seq_lens, slot_mapping)``, with DeepSeek V4.1's ``replay_start``
and a vision model's ``image_spans``) is checked
(:class:`~staticattn.validation.step_checks.StepChecks`), written into the staging and
replayed through the graph the :class:`~staticattn.graphs.dispatch.Dispatcher` picks, else
run eagerly under the reason it gives.

Each step passes through the same phases, which :mod:`staticattn.bench.breakdown` times
one by one: the checks (:meth:`StepChecks.uniform_decode <staticattn.validation.step_checks.
StepChecks.uniform_decode>`, :meth:`StepRunner.check`), the dispatcher's lookup, the staging
(:meth:`StepRunner.stage`) and :meth:`StepRunner.replay` or
:meth:`StepRunner.eager_graph_builds`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from staticattn.errors import GraphError
from staticattn.graphs.captured import CapturedGraph, EagerReason, GraphKind, RunResult
from staticattn.graphs.dispatch import Dispatcher, StepKey
from staticattn.graphs.eager import EagerSteps
from staticattn.graphs.options import EagerBuild, GraphOptions
from staticattn.graphs.pool import GraphPool
from staticattn.staging import StepInputs
from staticattn.validation.step_checks import CheckedStep, StepChecks

__all__ = ["StepRunner"]

_GRAPH, _DECODE, _MIXED = EagerBuild.GRAPH, GraphKind.DECODE, GraphKind.MIXED
_FORCED = EagerReason.FORCED


class StepRunner:
    """Steps handed as host arrays, for one manager.

    Takes the inputs, the manager's :class:`~staticattn.graphs.dispatch.Dispatcher`,
    :class:`~staticattn.graphs.eager.EagerSteps`, :class:`~staticattn.graphs.pool.GraphPool`
    (its replay stream carries the timing events), :class:`~staticattn.validation.
    step_checks.StepChecks` and the options (``time_gpu``). Owns ``time_gpu``
    (switchable through the manager) and ``closed`` (set by :meth:`close`: every later step
    is refused). Offers :meth:`run`, its phases, :meth:`close` and :meth:`require_open`.
    """

    def __init__(self, inputs: StepInputs, dispatcher: Dispatcher, eager: EagerSteps,
                 pool: GraphPool, checks: StepChecks, options: GraphOptions) -> None:
        self.inputs, self.config = inputs, inputs.config
        self.dispatcher, self.eager, self._pool, self.checks = dispatcher, eager, pool, checks
        self.time_gpu = options.time_gpu and inputs.device.type == "cuda"
        self.closed = False
        self._eager_build = eager.build
        self._graph_builds = eager.build is _GRAPH
        self._n = self.config.next_n
        self._max_reqs = self.config.max_num_seqs
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
            (:func:`~staticattn.validation.replay_start.check_replay_start`), before
            anything is written.
        image_spans : rows of ``(request, first, last)`` or a mapping ``request ->
            [(first, last), ...]``, optional
            DeepSeek V4's vision variant (``max_image_tokens > 0``,
            ``vllm-0.33-extras.md`` §3): positions ``first .. last`` of a request form one
            image, seen bidirectionally by its prefill tokens. Staged like the other inputs;
            checked whenever given (:func:`~staticattn.validation.image_spans.
            check_image_spans`: capacity, within the request, no overlap, at most ``W +
            mit`` tokens), before anything is written. None: no spans.
        eager : EagerBuild, optional
            Run eagerly through these builds even if a graph could replay the step (A/B
            checks, benchmarks), counted under ``EagerReason.FORCED``.

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
        # The replay path of a uniform decode step first, a handful of numpy calls: it runs
        # every decode step. O(1) tests first: a step whose token count is not k * next_n
        # is not uniform. Then the query lengths against k * [next_n] in their dtype, byte
        # for byte: one memcmp, cheaper than ``(q == n).all()``'s reduction.
        k = q.shape[0] if q.ndim == 1 else 0
        if ((eager is None or eager is _GRAPH) and replay_start is None
                and image_spans is None and 0 < k <= self._max_reqs
                and slots.shape[0] == k * n and q.dtype.kind in "iu" and q.tobytes() == (
                    self._decode_queries.get((k, q.dtype)) or self._decode_query(k, q.dtype))
                and self.checks.uniform_decode(k, s, slots)):
            dispatcher = self.dispatcher
            g = None if eager else dispatcher.decode(
                k, s.item(s.argmax()) if dispatcher.many_contexts else 0)
            if g is not None:
                self.inputs.stage_uniform_decode(s, slots)
                return self.replay(g, k * n)
            if eager or self._graph_builds:  # no decode graph: a bucket, or eager
                g, reason = (None, _FORCED) if eager else dispatcher.route(
                    StepKey(_DECODE, k * n, k, n, int(s.max())))
                if g is not None:  # every sequence >= next_n: a bucket holds the step
                    self.stage(q, s, slots, CheckedStep(n, n, None, None))
                    return self.replay(g, k * n)
                self.inputs.stage_uniform_decode(s, slots)
                return self.eager_graph_builds(k, k * n, True, reason)
        return self._run_general(q, s, slots, eager, replay_start, image_spans)

    def _decode_query(self, num_reqs: int, dtype: np.dtype) -> bytes:
        """The bytes of ``num_reqs`` query lengths of ``next_n`` in ``dtype`` (byte order
        included), kept per count and dtype: a uniform decode step's ``query_lens``."""
        pattern = self._decode_queries[(num_reqs, dtype)] = np.full(
            num_reqs, self._n, dtype=dtype).tobytes()
        return pattern

    def _run_general(self, q, s, slots, eager: EagerBuild | None,
                     replay_start=None, image_spans=None) -> RunResult:
        """Every step the decode replay path did not take: check, then replay the graph
        the dispatcher picks, or run eagerly."""
        if eager is not None and not isinstance(eager, EagerBuild):
            raise GraphError(f"eager must be None, EagerBuild.GRAPH or EagerBuild.REFERENCE; "
                             f"got {eager!r}")
        step = self.checks.arrays(q, s, slots, replay_start, image_spans)
        k, num_tokens = int(q.shape[0]), int(slots.shape[0])
        uniform = step.longest == self._n == step.shortest
        dispatcher = self.dispatcher
        if eager is not None:
            g, reason = None, _FORCED
        elif not uniform and (g := dispatcher.bucket(_MIXED, k, num_tokens)) is not None:
            # A step with a prefill or unequal decodes: its kind's one lookup, as an in-place
            # launch makes it; route() (no key object, no fallback walk) decides the rest.
            reason = None
        else:
            g, reason = dispatcher.route(StepKey(
                _DECODE if uniform else _MIXED, num_tokens, k, step.longest,
                int(s.max()) if dispatcher.many_contexts else 0))
        if g is not None:
            self.stage(q, s, slots, step, g.kind is _DECODE)
            return self.replay(g, num_tokens)
        if (eager or self._eager_build) is _GRAPH:
            self.stage(q, s, slots, step, uniform)
            return self.eager_graph_builds(k, num_tokens, uniform, reason)
        return self.eager_reference_builds(q, s, slots, step, reason)

    # ------------------------------------------------------------------ phases
    def check(self, q: np.ndarray, s: np.ndarray, slots: np.ndarray, replay_start=None,
              image_spans=None) -> CheckedStep:
        """The checks of a step of any composition (:meth:`StepChecks.arrays
        <staticattn.validation.step_checks.StepChecks.arrays>`). Host ints ``q``, ``s``
        ``(num_reqs,)``, ``slots`` ``(num_tokens,)``."""
        return self.checks.arrays(q, s, slots, replay_start, image_spans)

    def stage(self, q: np.ndarray, s: np.ndarray, slots: np.ndarray, step: CheckedStep,
              uniform: bool = False) -> None:
        """Write a checked step into the staging that a graph's staging kernels (or the
        same builds run eagerly) read: for a uniform decode step (``uniform``) its lengths,
        slots and request count only (its decodes replay nothing), else the query starts,
        token count, replay starts (None: 0s) and image spans (None: none) too. Host ints:
        ``q``, ``s`` ``(num_reqs,)``, ``slots`` ``(num_tokens,)``."""
        if uniform:
            self.inputs.stage_uniform_decode(s, slots)
        else:
            self.inputs.stage_step(q, s, slots, step.replay_start, step.image_spans)

    def replay(self, g: CapturedGraph, num_tokens: int) -> RunResult:
        """Launch a graph on a staged step of ``num_tokens`` tokens and count it; its
        result."""
        events = self._record_start() if self.time_gpu else None
        g.launch()
        g.replays += 1
        if events is None:  # untimed: the graph's one result object for this count
            return g.result_for(num_tokens)
        self._record_end(events)
        return RunResult(g.outputs_for(num_tokens), "graph", g.size, None, num_tokens, events,
                         g.kind)

    def eager_graph_builds(self, num_reqs: int, num_tokens: int, uniform: bool,
                           reason: EagerReason, recorded: bool = True) -> RunResult:
        """Run a staged step through the graph builds, eagerly (through their recorded
        launches unless ``recorded`` is off), counted under ``reason``."""
        events = self._record_start()
        outputs = self.eager.graph_builds(num_reqs, num_tokens, uniform, recorded=recorded)
        self._record_end(events)
        self.dispatcher.count_eager(reason)
        return RunResult(outputs, "eager", None, reason, num_tokens, events)

    def eager_reference_builds(self, q: np.ndarray, s: np.ndarray, slots: np.ndarray,
                               step: CheckedStep, reason: EagerReason,
                               phase_done=None) -> RunResult:
        """Stage a checked step with its padding and run the reference builds on it,
        eagerly, counted under ``reason``; ``phase_done(name)`` as in
        :meth:`EagerSteps.reference_builds <staticattn.graphs.eager.EagerSteps.
        reference_builds>`. Host ints ``q``, ``s`` ``(num_reqs,)``, ``slots``
        ``(num_tokens,)``."""
        counts = self.inputs.stage(q, s, slots, checked=True, replay_start=step.replay_start,
                                   image_spans=step.image_spans)
        if phase_done is not None:
            phase_done("stage")
        events = self._record_start()
        outputs = self.eager.reference_builds(counts, phase_done)
        self._record_end(events)
        self.dispatcher.count_eager(reason)
        return RunResult(outputs, "eager", None, reason, counts.num_tokens, events)

    def _record_start(self):
        if not self.time_gpu:
            return None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(self._pool.stream)
        return start, end

    def _record_end(self, events) -> None:
        if events is not None:
            events[1].record(self._pool.stream)
