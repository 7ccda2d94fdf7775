"""Capturing a manager's graphs: warm up, then capture, one graph per kind, context and
size, largest first, into one shared pool -- the one way staticattn records a CUDA graph.

:class:`Capturer` is the graph manager's capture part; a :class:`CaptureHook` lets a caller
watch a capture without a capture path of its own (the sanity checker guards its captures
through one).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch
from tqdm import tqdm

from staticattn.arena import Arena
from staticattn.builders.batch import Batch
from staticattn.errors import GraphError
from staticattn.graphs.branches import BuildBranches
from staticattn.graphs.captured import CapturedGraph, GraphKind
from staticattn.graphs.dispatch import Dispatcher
from staticattn.graphs.graph_launch import draws_random_numbers, make_launcher
from staticattn.graphs.introspect import new_graph, node_census
from staticattn.graphs.options import GraphOptions, StagingGuard
from staticattn.graphs.pool import GraphPool
from staticattn.graphs.python_gc import frozen_gc, gc_paused
from staticattn.graphs.sizes import (
    bucket_requests,
    default_capture_sizes,
    default_mixed_buckets,
    normalize_capture_sizes,
    normalize_mixed_buckets,
)
from staticattn.staging import StepInputs

__all__ = ["CaptureHook", "Capturer", "GraphSpec", "arena_contents_kept", "capture",
           "capture_failed", "warm_up"]

DECODE, MIXED = GraphKind.DECODE, GraphKind.MIXED


class GraphSpec(NamedTuple):
    """One graph to capture: its kind, size (tokens) and request slots, how to stage the
    minimal step it is warmed up and captured with, its body (returns ``(outputs,
    metadata)``) and the longest sequence it serves (its context bucket)."""

    kind: GraphKind
    size: int
    num_reqs: int
    stage: Callable[[], None]
    body: Callable[[], tuple[Any, Any]]
    context_len: int


class CaptureHook(Protocol):
    """What a caller may do around each capture of :meth:`Capturer.record`: wrap the body
    that is captured (``wrap``: guards, a watch), choose the capture's error mode
    (``error_mode``: "global", "thread_local" or "relaxed") and hear of a failure before it
    is raised (``failed(spec, phase, exc)``, ``phase`` "warm-up" or "capture")."""

    error_mode: str

    def wrap(self, spec: GraphSpec, body: Callable[[], Any]) -> Callable[[], Any]:
        """The body to capture for ``spec`` (called just before the capture begins)."""

    def failed(self, spec: GraphSpec, phase: str, exc: Exception) -> None:
        """Hear that ``spec``'s ``phase`` ("warm-up" or "capture") raised ``exc``."""


class Capturer:
    """Warm-up and capture of a manager's graphs into its pool.

    Takes the arena, its inputs, the builders, the step, the :class:`~staticattn.graphs.
    pool.GraphPool`, the options (``progress``, ``raw_launch``, ``staging_guard``) and the
    context buckets (tokens, ascending, the last ``max_model_len``): the decode graphs are
    captured once per bucket, for sequences of at most its length. Owns nothing it captures:
    every record goes to the :class:`~staticattn.graphs.dispatch.Dispatcher` it is handed.
    Offers :meth:`capture` (a manager's decode graphs and token buckets), :meth:`capture_each`
    (any graphs, as :class:`GraphSpec`, under an optional :class:`CaptureHook`), and what one
    graph holds: :meth:`builds`, :meth:`body`, :meth:`stage_warm_up`; ``marks_after_staging``
    says where the body records the staging guard's event.
    """

    def __init__(self, arena: Arena, inputs: StepInputs, builders: Sequence, step: Callable,
                 pool: GraphPool, options: GraphOptions, contexts: Sequence[int]) -> None:
        self.arena, self.inputs, self.pool = arena, inputs, pool
        self.builders, self.step = list(builders), step
        self.config = arena.config
        self.progress, self.raw_launch = options.progress, options.raw_launch
        #: The staging guard's event right after the staging kernels (else at the end).
        self.marks_after_staging = options.staging_guard is StagingGuard.STAGING
        self.contexts = list(contexts)
        #: The widest context bucket: what token buckets and eager decode builds serve.
        self.context_len = self.contexts[-1]
        self._n = self.config.next_n
        on_cuda = arena.device.type == "cuda"
        self.branches = (BuildBranches(arena.device, len(self.builders))
                         if options.branch_builds and on_cuda and len(self.builders) > 1
                         else None)

    def capture(self, sizes: Sequence[int] | None, buckets: Sequence[int] | None,
                dispatcher: Dispatcher) -> list[CapturedGraph]:
        """Capture the decode ``sizes`` (for every context bucket) and token ``buckets``
        (tokens; None: the defaults, empty: none) that ``dispatcher`` lacks, widest context
        and largest size first; see ``GraphManager.capture``."""
        cfg = self.config
        self.pool.require_cuda("run() still works: every step runs eagerly")
        sizes = default_capture_sizes(cfg) if sizes is None else (
            normalize_capture_sizes(cfg, sizes) if len(sizes) else [])
        buckets = (default_mixed_buckets(cfg) if buckets is None
                   else normalize_mixed_buckets(cfg, buckets))
        lacking = [b.name for b in self.builders if not hasattr(b, "build_mixed")]
        if buckets and lacking:
            raise GraphError(f"builders {lacking} have no build_mixed; capture token buckets "
                             "only with builders that do (or pass buckets=())")
        widest = self.context_len
        todo = [(MIXED, widest, b) for b in buckets]
        todo += [(DECODE, c, s) for c in self.contexts for s in sizes]
        have = {(g.kind, g.context_len, g.size) for g in dispatcher.all_graphs()}
        todo = sorted((item for item in todo if item not in have),
                      key=lambda item: (item[1], item[2]), reverse=True)
        return self.capture_each([self.spec(*item) for item in todo], dispatcher,
                                 self.progress)

    def spec(self, kind: GraphKind, context_len: int, size: int) -> GraphSpec:
        """The :class:`GraphSpec` of the manager's decode graph or token bucket of ``size``
        tokens (a decode graph: for context bucket ``context_len``)."""
        num_reqs = size // self._n if kind is DECODE else bucket_requests(self.config, size)
        return GraphSpec(kind, size, num_reqs,
                         lambda: self.stage_warm_up(kind, num_reqs, size),
                         lambda: self.body(kind, num_reqs, size, context_len), context_len)

    def capture_each(self, specs: Sequence[GraphSpec], dispatcher: Dispatcher,
                     show_progress: bool = False,
                     hook: CaptureHook | None = None) -> list[CapturedGraph]:
        """Capture ``specs`` in order into the pool (opened on first use), with gc frozen
        and the arena's contents put back after; each record goes to ``dispatcher``, those
        captured before a failure too. A failure raises :class:`GraphError` (after
        ``hook.failed``)."""
        self.pool.open()
        captured: list[CapturedGraph] = []
        with frozen_gc(), arena_contents_kept(self.arena):
            try:
                for spec in tqdm(specs, desc="capturing graphs", unit="graph",
                                 disable=not show_progress, leave=False):
                    try:
                        captured.append(self.record(spec, hook))
                    except Exception as exc:
                        raise capture_failed(exc, f"the {spec.kind.value} graph of {spec.size} "
                                             "tokens", self.arena.device) from exc
            finally:
                dispatcher.add(*captured)
        return captured

    def record(self, spec: GraphSpec, hook: CaptureHook | None = None) -> CapturedGraph:
        """Stage the minimal step, warm the body up, capture it into the pool and make its
        launcher (raw unless ``raw_launch`` is off or the body draws random numbers, which
        only ``replay()`` advances). Under ``hook`` the captured body is ``hook.wrap``'s,
        and a failure of the warm-up or the capture reaches ``hook.failed`` first."""
        pool = self.pool
        mem0 = pool.held_bytes()
        t0 = time.perf_counter()
        spec.stage()
        phase = "warm-up"
        try:
            _, draws = warm_up(lambda: draws_random_numbers(spec.body, pool.device),
                               pool.capture_stream)
            phase = "capture"
            body = spec.body if hook is None else hook.wrap(spec, spec.body)
            graph, (outputs, metadata) = capture(
                body, pool.capture_stream, pool=pool.handle,
                error_mode="global" if hook is None else hook.error_mode)
        except Exception as exc:
            if hook is not None:
                hook.failed(spec, phase, exc)
            raise
        launch, how = make_launcher(graph, pool.stream, raw=self.raw_launch and not draws)
        return CapturedGraph(
            kind=spec.kind, size=spec.size, num_reqs=spec.num_reqs, graph=graph,
            outputs=outputs, metadata=metadata, capture_s=time.perf_counter() - t0,
            pool_bytes=pool.held_bytes() - mem0, nodes=node_census(graph), launch=launch,
            how=how, context_len=spec.context_len,
        )

    def stage_warm_up(self, kind: GraphKind, num_reqs: int, num_tokens: int) -> None:
        """Stage the minimal step a graph is warmed up and captured with: every request as
        long as its query (a decode graph: ``num_reqs`` decodes of ``next_n``; a bucket: one
        fresh prefill), no slot written. Replays then see longer sequences."""
        if kind is DECODE:
            q = np.full(num_reqs, self._n)
        else:
            q = np.array([min(num_tokens, self.config.max_model_len)])
        self.inputs.stage(q, q, np.full(int(q.sum()), -1, dtype=np.int64))

    def body(self, kind: GraphKind, num_reqs: int, num_tokens: int,
             context_len: int | None = None, device_starts: bool = False):
        """What one graph holds: the staging kernels, every builder's build, the step, and
        the staging guard's event where ``staging_guard`` puts it (a decode graph's for
        sequences of at most ``context_len``, default the widest bucket; ``device_starts``
        as in :meth:`builds`). Returns ``(step outputs, {builder name: metadata})``."""
        after_staging = self.marks_after_staging
        batch, metadata = self.builds(kind, num_reqs, num_tokens, mark=after_staging,
                                      context_len=context_len, device_starts=device_starts)
        outputs = self.step(batch, metadata)
        if not after_staging:
            self.inputs.mark_staging_read()
        return outputs, metadata

    def builds(self, kind: GraphKind, num_reqs: int, num_tokens: int, mark: bool = True,
               context_len: int | None = None, device_starts: bool = False):
        """The staging kernels and every builder's graph build (``build_decode`` for a
        decode graph, for sequences of at most ``context_len``, default the widest bucket;
        else ``build_mixed``, staging the device's query starts with ``device_starts``:
        :meth:`StepInputs.copy_to_device <staticattn.staging.StepInputs.copy_to_device>`) at
        these extents; ``mark``: record the staging guard's event after the staging kernels.
        Returns ``(batch, {builder name: metadata})``."""
        if kind is DECODE:
            self.inputs.copy_to_device(num_reqs, num_tokens, uniform=True, mark=mark)
            batch = Batch.for_decode_capture(self.inputs, num_reqs,
                                             context_len or self.context_len)
            return batch, self._each_build(lambda b: b.build_decode(batch))
        self.inputs.copy_to_device(num_reqs, num_tokens, device_starts=device_starts, mark=mark)
        batch = Batch.for_mixed_capture(self.inputs, num_reqs, num_tokens)
        return batch, self._each_build(lambda b: b.build_mixed(batch))

    def _each_build(self, build: Callable[[Any], Any]) -> dict[str, Any]:
        """``{builder name: build(builder)}``: on branches of their own, or in order."""
        if self.branches is None:
            return {b.name: build(b) for b in self.builders}
        return self.branches.run(self.builders, build)


def warm_up(fn: Callable[[], Any], stream: torch.cuda.Stream) -> Any:
    """Run ``fn`` once, eagerly, on ``stream`` (ordered after the current stream's work) and
    wait for it: every kernel compiles and every lazy library initialises outside the
    capture, where doing so is not allowed."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        result = fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    return result


def capture(
    fn: Callable[[], Any],
    stream: torch.cuda.Stream,
    *,
    pool=None,
    error_mode: str = "global",
) -> tuple[torch.cuda.CUDAGraph, Any]:
    """Record ``fn`` on ``stream`` into a new graph (sharing ``pool`` when given) and
    instantiate it now rather than at its first replay, with Python's gc paused
    (:mod:`staticattn.graphs.python_gc`). Returns ``(graph, fn's result)``; an exception
    from ``fn`` ends the capture and propagates."""
    graph = new_graph()
    current = torch.cuda.current_stream(stream.device)
    try:
        with gc_paused(), torch.cuda.graph(graph, pool=pool, stream=stream,
                                           capture_error_mode=error_mode):
            result = fn()
    except BaseException:
        # When the capture fails, torch's graph context raises from capture_end before it
        # restores the stream it made current: every later op of this thread would then run
        # on the capture stream, unordered with the graphs replayed on the replay stream.
        torch.cuda.set_stream(current)
        raise
    if getattr(graph, "raw_cuda_graph", None) is not None and hasattr(graph, "instantiate"):
        try:
            graph.instantiate()
        except RuntimeError:
            pass  # torch versions that instantiate in capture_end refuse a second one
    torch.cuda.synchronize()
    return graph, result


def capture_failed(exc: Exception, what: str, device: torch.device) -> GraphError:
    """The error for a capture of ``what`` that raised ``exc``, once the device is idle (the
    failed graph is not recorded; those captured before stay usable)."""
    torch.cuda.synchronize(device)
    return GraphError(
        f"capturing {what} failed: {type(exc).__name__}: {exc}. Everything captured must "
        "launch only kernels on fixed buffers: no host read (.item(), .tolist(), .cpu()), no "
        "allocation outside the pool, no branch on data (python -m staticattn check names "
        "the offending op)"
    )


@contextmanager
def arena_contents_kept(arena: Arena):
    """Warm-ups and captures write minimal-length inputs and their metadata into the arena;
    put back what the last step left there, so capturing (or failing to) at any time
    disturbs nothing an engine may still read."""
    saved = {w: arena.block(w).clone() for w in ("device", "host")}
    try:
        yield
    finally:
        torch.cuda.synchronize(arena.device)
        for w, block in saved.items():
            arena.block(w).copy_(block)
        torch.cuda.synchronize(arena.device)
