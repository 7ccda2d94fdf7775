"""GraphManager: every step replays a captured graph, metadata build included.

Workflow:

1. ``GraphManager(arena, inputs, builders, step)`` -- builders already bound to ``arena``
   (see :func:`staticattn.builders.make_arena`); ``step(batch, metadata)`` is the user's own
   work, called with the batch and ``{builder.name: metadata}``. It may launch any kernels;
   it must write its outputs into memory it owns (or the arena) and return them (a tensor,
   a tuple, list or dict of tensors, or None), leading dimension = tokens.
2. ``capture(sizes, buckets)`` -- one graph per uniform decode size (``sizes``, tokens) and
   one per token bucket (``buckets``: steps of any composition -- decodes with chunked
   prefill, prefills, decodes of unequal lengths); largest first, one shared memory pool,
   Python's gc frozen; each graph = staging kernels + every builder's build + ``step``,
   warmed up first at minimal sequence lengths.
3. Per step, either

   * ``run(query_lens, seq_lens, slot_mapping)`` -- validate, write the host arrays into the
     staging and launch: a uniform decode step replays the smallest decode graph that holds
     it, any other step the smallest token bucket that holds it; only a step beyond every
     captured graph runs eagerly (the manager counts why); or
   * the in-place API of an engine's decode loop: ``views = begin_step()`` (waits until the
     previous replay has read the staging), write ``views.seq_lens[:k]``,
     ``views.slot_mapping[:t]`` (and ``views.query_start_loc[: k + 1]`` for a step of any
     composition) directly, then ``launch(k)`` (uniform decode) or ``launch(k, t)``:
     bounds checked in a few vectorized passes, one graph launch, nothing else.

   Block tables are not arguments: the engine updates the rows that changed in
   ``inputs.block_table`` (and ``inputs.swa_block_table``) in place.
4. ``close()`` (or leave the ``with`` block) -- drops the graphs and their pool.

Replays run on the stream that was current when ``capture`` first ran (``manager.stream``).

Example (on a CUDA machine; ``step`` reads metadata views and writes buffers it owns)::

    cfg = ArenaConfig.deepseek_v4(max_model_len=65536)
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    with GraphManager(arena, inputs, builders, step) as gm:
        gm.capture()  # default decode sizes and token buckets
        inputs.block_table[:3, :4] = torch.arange(1, 13).view(3, 4)  # engine-owned rows
        res = gm.run([2, 2, 2], [100, 37, 5000], np.arange(6))  # graph, decode, size 8
        res = gm.run([2, 1, 300], [100, 37, 300], np.arange(303))  # graph, mixed, 512
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from staticattn.arena import Arena
from staticattn.builders.batch import Batch
from staticattn.builders.contract import MetadataBuilder
from staticattn.builders.validation.host import (
    screen_step,
    uniform_decode_passes,
    validate_host_step,
)
from staticattn.builders.validation.values import slot_bound
from staticattn.builders.validation.views import ViewChecks
from staticattn.errors import GraphError, InvalidBatchError
from staticattn.graphs.capturing import GraphCapture
from staticattn.graphs.eager import EagerSteps
from staticattn.graphs.in_place import InPlaceSteps
from staticattn.graphs.records import (
    DECODE,
    CapturedGraph,
    GraphTable,
    RunResult,
    RunStats,
    describe_graphs,
)
from staticattn.staging import StepInputs

__all__ = ["GraphManager", "StepFn"]

StepFn = Callable[[Batch, dict[str, Any]], Any]


class GraphManager(GraphCapture, InPlaceSteps, EagerSteps):
    """Captures and replays the graphs of every step (see the module docstring).

    Parameters
    ----------
    arena : Arena
        Allocated; every builder is bound to it.
    inputs : StepInputs
        The arena's input views and staging.
    builders : sequence of MetadataBuilder
        Their ``build_decode`` / ``build_mixed`` run inside the graphs, ``build`` eagerly.
    step : callable ``(batch, metadata) -> outputs``
        The user's work. Outputs must live in memory the step owns: a fresh tensor
        returned from inside a capture would come from the graph pool and be overwritten
        by the next replay of any graph -- results are valid until the next step.
    validate : bool
        Check every step before anything is written or launched (default True). With
        False the caller promises what :func:`~staticattn.builders.validation.host.
        validate_host_step` checks (``run``) or what :class:`~staticattn.builders.
        validate_views.ViewChecks` checks (``launch``); a step that breaks the promise may
        read or write out of bounds.
    progress : bool
        Show a progress bar while capturing.
    time_gpu : bool
        Record CUDA events around each ``run``'s device work (``RunResult.gpu_us()``).
    num_kv_blocks : int, optional
        Blocks of the KV pool the slot mapping addresses; slots are then checked against it.
    raw_launch : bool
        Launch graphs through ``cudaGraphLaunch`` when cuda-bindings is there (default).
    eager_build : {"auto", "graph", "reference"}
        What a step no captured graph holds runs: "graph", the builds a graph holds
        (``build_decode`` / ``build_mixed`` after the staging kernels), launched eagerly at
        the step's own extents -- a few kernels and no host planning, and the metadata a
        replay would give; "reference", every builder's ``build`` (host planning, exact
        extents). "auto" (default): "graph" when every builder has both graph builds.
        ``run(..., eager=True)`` always runs the reference, for A/B checks.
    eager_plans : int
        With the "graph" eager builds on CUDA (Triton kernels, cuda-bindings), keep up to
        this many launch plans (:mod:`~staticattn.graphs.launch_plans`): the builds' launches
        at a step's extents, recorded once and issued again through the driver, without the
        builders' Python. 0 turns them off. Default 256.
    staging_guard : {"staging", "step"}
        Where a graph records the event the host waits for before rewriting the staging:
        "staging" (default), after the staging kernels (the next step may be staged while
        this one still runs); "step", at the graph's end (cheaper per launch and wait, see
        docs/results), for loops that never stage a step before the last one finished.
    """

    def __init__(
        self,
        arena: Arena,
        inputs: StepInputs,
        builders: Sequence[MetadataBuilder],
        step: StepFn,
        *,
        validate: bool = True,
        progress: bool = True,
        time_gpu: bool = False,
        num_kv_blocks: int | None = None,
        raw_launch: bool = True,
        eager_build: str = "auto",
        eager_plans: int = 256,
        staging_guard: str = "staging",
    ) -> None:
        if staging_guard not in ("staging", "step"):
            raise GraphError(f"staging_guard must be 'staging' or 'step'; got {staging_guard!r}")
        if type(eager_plans) is not int or eager_plans < 0:
            raise GraphError(f"eager_plans must be an int >= 0; got {eager_plans!r}")
        if eager_build not in ("auto", "graph", "reference"):
            raise GraphError(f"eager_build must be 'auto', 'graph' or 'reference'; got "
                             f"{eager_build!r}")
        self.arena = arena
        self.inputs = inputs
        self.config = arena.config
        self.builders = list(builders)
        self.step = step
        self.validate = validate
        self.progress = progress
        self.time_gpu = time_gpu and arena.device.type == "cuda"
        self.num_kv_blocks = num_kv_blocks
        self.raw_launch = raw_launch
        self.staging_guard = staging_guard
        graph_builds = all(hasattr(b, "build_decode") and hasattr(b, "build_mixed")
                           for b in builders)
        if eager_build == "graph" and not graph_builds:
            raise GraphError("eager_build='graph' needs build_decode and build_mixed on every "
                             "builder")
        self.eager_build = "graph" if eager_build == "auto" and graph_builds else (
            "reference" if eager_build == "auto" else eager_build)
        self.graphs: dict[int, CapturedGraph] = {}
        self.mixed_graphs: dict[int, CapturedGraph] = {}
        self.stats = RunStats()
        self.stream: torch.cuda.Stream | None = None
        self._n = self.config.next_n
        self._slot_bound = slot_bound(self.config, num_kv_blocks, None)
        self._checks = ViewChecks(inputs.host, self.config, self._slot_bound)
        self._host_counts = inputs.host.counts
        self._table = self._new_table()
        self._pool = None
        self._capture_stream: torch.cuda.Stream | None = None
        self._closed = False
        # The longest sequence the decode graphs are captured for (None: max_model_len);
        # only graphs.contexts' bucket managers set it, and they refuse longer steps.
        self._context_len: int | None = None
        self.plans = self._make_plans(eager_plans)
        self._decode_queries: dict[tuple[int, np.dtype], bytes] = {}

    # ---------------------------------------------------------------- lifecycle
    def __enter__(self) -> GraphManager:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Release every graph and the shared pool (after the device is idle)."""
        if self._closed:
            return
        if (self.graphs or self.mixed_graphs) and torch.cuda.is_available():
            torch.cuda.synchronize(self.arena.device)
        self.graphs.clear()
        self.mixed_graphs.clear()
        self._table = self._new_table()
        self._pool = None
        if self.plans is not None:
            self.plans.clear()
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def capture_sizes(self) -> list[int]:
        return sorted(self.graphs)

    @property
    def buckets(self) -> list[int]:
        return sorted(self.mixed_graphs)

    def _check_open(self) -> None:
        if self._closed:
            raise GraphError("the GraphManager is closed; create a new one to capture or run")

    def _new_table(self) -> GraphTable:
        cfg = self.config
        return GraphTable(self.graphs, self.mixed_graphs, cfg.max_num_seqs,
                          cfg.max_num_batched_tokens)

    # ---------------------------------------------------------------------- run
    def run(
        self,
        query_lens: Sequence[int] | np.ndarray,
        seq_lens: Sequence[int] | np.ndarray,
        slot_mapping: Sequence[int] | np.ndarray,
        *,
        eager: bool | str = False,
    ) -> RunResult:
        """Run one step: replay the graph that holds it, else eagerly.

        Parameters
        ----------
        query_lens, seq_lens : int ``(num_reqs,)``
            Decodes first (the batch is reordered decode -> extend -> prefill).
        slot_mapping : int64 ``(num_tokens,)``
            -1 = do not write.
        eager : bool or {"reference", "graph"}
            Run eagerly even if a graph could replay the step (A/B checks, benchmarks),
            counted under the reason "forced": True or "reference", the reference builds;
            "graph", the builds a graph holds (see ``eager_build``).

        Returns
        -------
        RunResult
            ``outputs`` sliced to the real tokens; valid until the next step.
        """
        if self._closed:
            self._check_open()
        q = np.asarray(query_lens)
        s = np.asarray(seq_lens)
        slots = np.asarray(slot_mapping)
        n = self._n
        # Replay path first, kept to a handful of numpy calls: it runs every decode step.
        k = q.shape[0] if q.ndim == 1 else 0
        table = self._table.decode
        # O(1) tests first: a step whose token count is not k * next_n is not uniform. Then
        # the query lengths against k * [next_n] in their dtype, byte for byte: one memcmp,
        # cheaper than ``(q == n).all()``'s reduction.
        if (eager in (False, "graph") and 0 < k < len(table) and slots.shape[0] == k * n
                and q.dtype.kind in "iu" and q.tobytes() == (
                    self._decode_queries.get((k, q.dtype)) or self._decode_query(k, q.dtype))
                and (
                    uniform_decode_passes(k, s, slots, self.config, self._slot_bound)
                    if self.validate else self._uniform_extents(k, s))):
            g = None if eager else table[k]
            if g is not None:
                self.inputs.stage_uniform_decode(s, slots)
                return self._replay(g, k * n)
            if eager or self.eager_build == "graph":  # no decode graph: a bucket, or eager
                g, reason = (None, "forced") if eager else self._graph_for_step(k, k * n,
                                                                                True, n)
                if g is not None:  # every sequence >= next_n: a bucket holds the step
                    self.stage_for_graph(q, s, slots, False)
                    return self._replay(g, k * n)
                self.inputs.stage_uniform_decode(s, slots)
                return self._eager_graph_build(k, k * n, True, reason)
        return self._run_general(q, s, slots, eager)

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

    def _run_general(self, q, s, slots, eager: bool | str) -> RunResult:
        """Every step the decode replay path did not take: check, then replay the graph
        that holds it, or run eagerly."""
        if eager not in (False, True, "reference", "graph"):
            raise GraphError(f"eager must be a bool, 'reference' or 'graph'; got {eager!r}")
        if q.ndim == 1 and q.shape[0] == 0:
            raise InvalidBatchError("a step needs at least one request; got none")
        lengths = screen_step(q, s, slots, self.config, self._slot_bound) if self.validate else None
        if lengths is None:
            if self.validate:
                validate_host_step(q, s, slots, self.config, require_decode_first=True,
                                   num_kv_blocks=self.num_kv_blocks,
                                   decode_threshold=self.config.decode_threshold)
            lengths = int(q.min()), int(q.max())
        k, num_tokens = int(q.shape[0]), int(slots.shape[0])
        shortest, longest = lengths
        uniform = longest == self._n == shortest
        if eager:
            g, reason = None, "forced"
        else:
            g, reason = self._graph_for_step(k, num_tokens, uniform, longest)
        if g is not None:
            self.stage_for_graph(q, s, slots, g.kind == DECODE)
            return self._replay(g, num_tokens)
        if eager == "graph" or (not eager and self.eager_build == "graph"):
            if not self.validate:  # the extents still bound every kernel
                self.inputs.check_extents(q, s, slots, k, num_tokens)
            self.stage_for_graph(q, s, slots, uniform)
            return self._eager_graph_build(k, num_tokens, uniform, reason)
        counts = self.inputs.stage(q, s, slots, checked=self.validate)
        events = self._record_start()
        outputs = self.launch_eager(counts)
        self._record_end(events)
        self.stats.eager[reason] += 1
        return RunResult(outputs, "eager", None, reason, num_tokens, events)

    def _graph_for_step(self, num_reqs: int, num_tokens: int, uniform: bool, longest: int):
        """``(graph, None)`` if a captured graph holds the step, else ``(None, reason)``:
        "not-captured", "prefill" / "non-uniform" (no token bucket captured) or
        "too-large". ``uniform``: every request schedules ``next_n`` tokens; ``longest``:
        the longest query."""
        decode, mixed = self._table.decode, self._table.mixed
        if uniform and num_reqs < len(decode) and decode[num_reqs] is not None:
            return decode[num_reqs], None
        g = mixed[num_tokens] if num_tokens < len(mixed) else None
        if g is not None and g.num_reqs >= num_reqs:
            return g, None
        if not self._has_graphs():
            return None, "not-captured"
        if not self.mixed_graphs and not uniform:
            return None, "prefill" if longest > self._n else "non-uniform"
        return None, "too-large"

    def _has_graphs(self) -> bool:
        return bool(self.graphs or self.mixed_graphs)

    def stage_for_graph(self, q: np.ndarray, s: np.ndarray, slots: np.ndarray,
                        uniform: bool) -> None:
        """Write a checked step into the staging that a graph's staging kernels (or the
        same builds run eagerly) read: for a uniform decode step (``uniform``) the lengths,
        slots and request count only, else the query starts and token count too. Host
        ints: ``q``, ``s`` ``(num_reqs,)``, ``slots`` ``(num_tokens,)``."""
        if uniform:
            self.inputs.stage_uniform_decode(s, slots)
        else:
            self.inputs.stage_step(q, s, slots)

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
        start.record(self.stream)
        return start, end

    def _record_end(self, events) -> None:
        if events is not None:
            events[1].record(self.stream)

    # ------------------------------------------------------------------ reports
    def describe(self) -> str:
        """A table per captured graph (kind, tokens, requests, capture time, nodes, pool
        memory, how it is launched), the totals, the step counts and the launch plans."""
        text = describe_graphs(self.graphs, self.mixed_graphs, self.stats)
        if self.plans is None:
            return text
        st = self.plans.stats
        return (f"{text}\neager launch plans: {len(self.plans)} kept, {st.hits} steps through "
                f"them, {st.recorded} recorded, {st.unplannable} extents unplannable")
