"""Capturing a manager's graphs: warm up, then capture, one graph per kind and size, largest
first, into one shared pool -- the one way staticattn records a CUDA graph.

:class:`Capturer` is the graph manager's capture part; the functions beside it are what
every capture does (the sanity checker captures through them too).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np
import torch

from staticattn.arena import Arena
from staticattn.builders.batch import Batch
from staticattn.errors import GraphError
from staticattn.graphs.captured import CapturedGraph, GraphKind
from staticattn.graphs.graph_launch import draws_random_numbers, make_launcher
from staticattn.graphs.introspect import new_graph, node_census
from staticattn.graphs.options import GraphOptions, StagingGuard
from staticattn.graphs.pool import GraphPool
from staticattn.graphs.sizes import (
    bucket_requests,
    default_capture_sizes,
    default_mixed_buckets,
    normalize_capture_sizes,
    normalize_mixed_buckets,
)
from staticattn.graphs.table import GraphTable
from staticattn.staging import StepInputs

__all__ = ["Capturer", "GraphSpec", "arena_contents_kept", "capture", "capture_failed",
           "frozen_gc", "progress", "warm_up"]

DECODE, MIXED = GraphKind.DECODE, GraphKind.MIXED


class GraphSpec(NamedTuple):
    """One graph to capture: its kind, size (tokens) and request slots, how to stage the
    minimal step it is warmed up and captured with, and its body (returns ``(outputs,
    metadata)``)."""

    kind: GraphKind
    size: int
    num_reqs: int
    stage: Callable[[], None]
    body: Callable[[], tuple[Any, Any]]


class Capturer:
    """Warm-up and capture of a manager's graphs into its pool.

    Takes the arena, its inputs, the builders, the step, the :class:`~staticattn.graphs.
    pool.GraphPool`, the options (``progress``, ``raw_launch``, ``staging_guard``) and
    ``context_len``: the longest sequence the decode graphs are captured for (None:
    ``max_model_len``). Owns nothing it captures: every record goes to the
    :class:`~staticattn.graphs.table.GraphTable` it is handed. Offers :meth:`capture` (a
    manager's decode graphs and token buckets), :meth:`capture_each` (any graphs, as
    :class:`GraphSpec`), and what one graph holds: :meth:`builds`, :meth:`body`,
    :meth:`stage_warm_up`, :meth:`warm_up`; ``marks_after_staging`` says where the body
    records the staging guard's event.
    """

    def __init__(self, arena: Arena, inputs: StepInputs, builders: Sequence, step: Callable,
                 pool: GraphPool, options: GraphOptions, context_len: int | None = None) -> None:
        self.arena, self.inputs, self.pool = arena, inputs, pool
        self.builders, self.step = list(builders), step
        self.config = arena.config
        self.progress, self.raw_launch = options.progress, options.raw_launch
        #: The staging guard's event right after the staging kernels (else at the end).
        self.marks_after_staging = options.staging_guard is StagingGuard.STAGING
        self.context_len = context_len
        self._n = self.config.next_n

    def capture(self, sizes: Sequence[int] | None, buckets: Sequence[int] | None,
                table: GraphTable) -> list[CapturedGraph]:
        """Capture the decode ``sizes`` and token ``buckets`` (tokens; None: the defaults,
        empty: none) that ``table`` lacks, largest first; see ``GraphManager.capture``."""
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
        todo = [(MIXED, b) for b in buckets if b not in table.by_size(MIXED)]
        todo += [(DECODE, s) for s in sizes if s not in table.by_size(DECODE)]
        todo.sort(key=lambda item: item[1], reverse=True)
        return self.capture_each([self._spec(kind, size) for kind, size in todo], table,
                                 self.progress)

    def _spec(self, kind: GraphKind, size: int) -> GraphSpec:
        num_reqs = size // self._n if kind is DECODE else bucket_requests(self.config, size)
        return GraphSpec(kind, size, num_reqs,
                         lambda: self.stage_warm_up(kind, num_reqs, size),
                         lambda: self.body(kind, num_reqs, size))

    def capture_each(self, specs: Sequence[GraphSpec], table: GraphTable,
                     show_progress: bool = False) -> list[CapturedGraph]:
        """Capture ``specs`` in order into the pool (opened on first use), with gc frozen
        and the arena's contents put back after; each record goes to ``table``, those
        captured before a failure too. A failure raises :class:`GraphError`."""
        self.pool.open()
        captured: list[CapturedGraph] = []
        with frozen_gc(), arena_contents_kept(self.arena):
            try:
                for spec in progress(specs, show_progress, "capturing graphs"):
                    try:
                        captured.append(self.record(spec))
                    except Exception as exc:
                        raise capture_failed(exc, f"the {spec.kind.value} graph of {spec.size} "
                                             "tokens", self.arena.device) from exc
            finally:
                table.add(*captured)
        return captured

    def record(self, spec: GraphSpec) -> CapturedGraph:
        """Stage the minimal step, warm the body up, capture it into the pool and make its
        launcher (raw unless ``raw_launch`` is off or the body draws random numbers, which
        only ``replay()`` advances)."""
        pool = self.pool
        mem0 = pool.held_bytes()
        t0 = time.perf_counter()
        spec.stage()
        _, draws = warm_up(lambda: draws_random_numbers(spec.body, pool.device),
                           pool.capture_stream)
        graph, (outputs, metadata) = capture(spec.body, pool.capture_stream, pool=pool.handle)
        launch, how = make_launcher(graph, pool.stream, raw=self.raw_launch and not draws)
        return CapturedGraph(
            kind=spec.kind, size=spec.size, num_reqs=spec.num_reqs, graph=graph,
            outputs=outputs, metadata=metadata, capture_s=time.perf_counter() - t0,
            pool_bytes=pool.held_bytes() - mem0, nodes=node_census(graph), launch=launch,
            how=how,
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

    def warm_up(self, num_reqs: int, num_tokens: int, stream: torch.cuda.Stream) -> None:
        """Run one decode graph's body eagerly at minimal sequence lengths, so the capture
        that follows compiles nothing and starts short."""
        self.stage_warm_up(DECODE, num_reqs, num_tokens)
        warm_up(lambda: self.body(DECODE, num_reqs, num_tokens), stream)

    def body(self, kind: GraphKind, num_reqs: int, num_tokens: int):
        """What one graph holds: the staging kernels, every builder's build, the step, and
        the staging guard's event where ``staging_guard`` puts it. Returns ``(step outputs,
        {builder name: metadata})``."""
        after_staging = self.marks_after_staging
        batch, metadata = self.builds(kind, num_reqs, num_tokens, mark=after_staging)
        outputs = self.step(batch, metadata)
        if not after_staging:
            self.inputs.mark_staging_read()
        return outputs, metadata

    def builds(self, kind: GraphKind, num_reqs: int, num_tokens: int, mark: bool = True):
        """The staging kernels and every builder's graph build (``build_decode`` for a
        decode graph, else ``build_mixed``) at these extents; ``mark``: record the staging
        guard's event after the staging kernels. Returns ``(batch, {builder name:
        metadata})``."""
        if kind is DECODE:
            self.inputs.copy_to_device(num_reqs, num_tokens, uniform=True, mark=mark)
            batch = Batch.for_decode_capture(self.inputs, num_reqs, self.context_len)
            return batch, {b.name: b.build_decode(batch) for b in self.builders}
        self.inputs.copy_to_device(num_reqs, num_tokens, mark=mark)
        batch = Batch.for_mixed_capture(self.inputs, num_reqs, num_tokens)
        return batch, {b.name: b.build_mixed(batch) for b in self.builders}


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
    instantiate it now rather than at its first replay. Returns ``(graph, fn's result)``;
    an exception from ``fn`` ends the capture and propagates."""
    graph = new_graph()
    current = torch.cuda.current_stream(stream.device)
    try:
        with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode=error_mode):
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


@contextmanager
def frozen_gc():
    """Capture with Python's gc frozen and off: a collection in the middle of a capture
    can free tensors whose memory the graph already baked in, and it costs time per size."""
    gc.collect()
    gc.freeze()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        gc.unfreeze()


def progress(items, enabled: bool, desc: str):
    """``items`` wrapped in a progress bar when ``enabled`` (and tqdm is there), else as is."""
    if not enabled:
        return items
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, unit="graph", leave=False)
