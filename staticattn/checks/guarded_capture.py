"""Capture one graph under the checker's guards and turn what the guards saw into findings.

The capture is the graph manager's own (:meth:`Capturer.capture_each
<staticattn.graphs.capturer.Capturer.capture_each>`: its warm-up, pool and streams), watched
through a :class:`~staticattn.graphs.capturer.CaptureHook`: the body (staging kernels +
every builder's ``build_decode`` + the step) runs under the guards, and the step is wrapped
by :class:`PhasedStep` so the watch tells the builds' ops from the step's. Sync-debug mode
"error" is set inside the capture (entering a capture synchronises on purpose):
:func:`sync_guard`.
"""

from __future__ import annotations

import traceback
from collections import Counter
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from staticattn.checks.check_report import SizeCheck
from staticattn.checks.frozen import Call
from staticattn.checks.watch import ArenaIndex, CaptureWatch
from staticattn.errors import GraphError
from staticattn.graphs.captured import GraphKind
from staticattn.graphs.capturer import GraphSpec
from staticattn.graphs.dispatch import Dispatcher
from staticattn.graphs.manager import GraphManager, StepFn

__all__ = ["Captured", "GuardHook", "PhasedStep", "body_calls", "guarded_capture", "sync_guard"]

#: aten ops that wait on the device, and the Python spelling users know them by.
SYNC_OPS = {
    "_local_scalar_dense": " (.item() / int() / float() / bool() of a CUDA tensor)",
    "nonzero": " (nonzero / boolean-mask indexing / torch.where with one argument)",
    "_to_copy": " (.cpu() / .tolist() / .to('cpu'))",
    "copy_": " (a copy to or from pageable host memory)",
    "is_nonzero": " (bool() of a CUDA tensor, e.g. `if t.any():`)",
    "repeat_interleave": " (repeat_interleave without output_size)",
    "unique": " (torch.unique)",
}
_SYNC_MESSAGE = "synchronizing CUDA operation"  # what sync-debug mode "error" raises


@contextmanager
def sync_guard():
    """Make synchronising CUDA ops (``.item()``, ``.tolist()``, ``nonzero``...) raise while
    inside instead of silently breaking the capture (restores the previous mode);
    :class:`~staticattn.checks.watch.CaptureWatch` names the op that raised."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


class PhasedStep:
    """The user's step, marking the watch's phase "step" while it runs."""

    def __init__(self, step: StepFn) -> None:
        self.step = step
        self.watch: CaptureWatch | None = None

    @contextmanager
    def watching(self, watch: CaptureWatch):
        """Mark ``watch``'s phases while inside."""
        self.watch = watch
        try:
            yield
        finally:
            self.watch = None

    def __call__(self, batch, metadata):
        watch = self.watch
        if watch is None:
            return self.step(batch, metadata)
        watch.phase = "step"
        try:
            return self.step(batch, metadata)
        finally:
            watch.phase = "build"


@dataclass(slots=True)
class Captured:
    """A graph the checker captured, what it returned, and what its watch saw."""

    size: int
    graph: torch.cuda.CUDAGraph
    outputs: Any
    metadata: dict[str, Any]
    watch: CaptureWatch


class GuardHook:
    """The checker's :class:`~staticattn.graphs.capturer.CaptureHook`: the captured body
    runs under the sync guard and ``watch``; a failed warm-up or capture becomes a finding
    of ``report``; ``allocations_before`` is the allocator's count when the capture began."""

    error_mode = "thread_local"

    def __init__(self, watch: CaptureWatch | None, report: SizeCheck | None) -> None:
        self.watch, self.report = watch, report
        self.allocations_before = 0

    def wrap(self, spec: GraphSpec, body):
        """``body`` under the sync guard and the watch; the allocator's count noted."""
        self.allocations_before = _allocations()
        watch = self.watch
        if watch is None:
            return body

        def guarded_body():
            with sync_guard(), watch:
                return body()

        return guarded_body

    def failed(self, spec: GraphSpec, phase: str, exc: Exception) -> None:
        """The failure as a finding: the step fails eagerly, or the capture broke."""
        if self.report is None:
            return
        if phase == "warm-up":
            self.report.add("eager_failure", f"the step fails even eagerly: {exc!r}")
        else:
            _capture_broke(exc, self.watch, self.report)


def guarded_capture(manager: GraphManager, phased: PhasedStep, num_reqs: int, size: int,
                    report: SizeCheck, index: ArenaIndex) -> Captured | None:
    """Warm up and capture the decode graph of ``size`` tokens through the manager's own
    capture path (its pool and streams, as every graph it captures); add the findings to
    ``report``. None when the step fails eagerly or the capture breaks."""
    capturer, inputs = manager.capturer, manager.inputs
    context = capturer.context_len
    # Allocations the capture machinery itself makes around the staging kernels alone,
    # subtracted as noise (captured into a scratch record, dropped after).
    counting = GuardHook(None, None)
    scratch = GraphSpec(GraphKind.DECODE, size, num_reqs, lambda: None, lambda: (
        inputs.copy_to_device(num_reqs, size, uniform=True), {}), context)
    capturer.capture_each([scratch], Dispatcher(manager.config, manager.contexts),
                          hook=counting)
    baseline = _allocations() - counting.allocations_before
    watch = CaptureWatch(arena=index)
    hook = GuardHook(watch, report)
    try:
        with phased.watching(watch):
            [graph] = capturer.capture_each([capturer.spec(GraphKind.DECODE, context, size)],
                                            manager.dispatcher, hook=hook)
    except GraphError:  # the hook has named what broke it (the device is idle again)
        return None
    unattributed = _allocations() - hook.allocations_before - baseline
    add_watch_findings(watch, report)
    if not watch.allocations and unattributed > 0:
        report.add("library_allocation",
                   f"{unattributed} allocations inside capture beyond the staging-only "
                   "baseline by no aten op (an extension allocating through the caching "
                   "allocator): graph pool memory, valid until the next replay")
    return Captured(size, graph.graph, graph.outputs, graph.metadata, watch)


def body_calls(manager: GraphManager, num_reqs: int, size: int, index: ArenaIndex,
               device_type: str = "cuda") -> tuple[Any, list[Call]]:
    """The decode graph's body (``num_reqs`` requests, ``size`` tokens) run eagerly on the
    staged step under a watch: ``(its outputs, its calls)``, what
    :func:`~staticattn.checks.frozen.frozen_cause` compares with a capture's calls."""
    watch = CaptureWatch(arena=index, device_type=device_type)
    step = manager.step
    with step.watching(watch) if isinstance(step, PhasedStep) else nullcontext(), watch:
        outputs, _ = manager.capturer.body(GraphKind.DECODE, num_reqs, size)
    return outputs, watch.calls


def add_watch_findings(watch: CaptureWatch, report: SizeCheck) -> None:
    """One finding per kind of thing the watch saw (the first few instances named)."""
    for kind, items in (("host_read", watch.host_reads), ("arena_write", watch.arena_writes),
                        ("wrong_stream", watch.wrong_stream)):
        if items:
            report.add(kind, _listed(items))
    unsafe = [op for op, safe in watch.rng if not safe]
    if unsafe:
        report.add("rng_generator",
                   f"{_listed(unsafe)}: drawn from a generator that CUDAGraph.replay does "
                   "not advance (every replay repeats the captured numbers); draw from the "
                   "default CUDA generator")
    elif watch.rng:
        report.add("graph_safe_rng",
                   f"{_listed([op for op, _ in watch.rng])}: default CUDA generator, advanced "
                   "by every replay (launched with replay(), not cudaGraphLaunch)")
    if watch.allocations:
        by_op = Counter(f"{a.op} ({a.phase})" for a in watch.allocations)
        report.add("pool_allocation",
                   f"{len(watch.allocations)} allocations inside capture: "
                   + ", ".join(f"{op} x{c}" for op, c in sorted(by_op.items()))
                   + "; output lives in the graph pool; valid until the next replay of any "
                   "graph sharing the pool")


def _capture_broke(exc: Exception, watch: CaptureWatch, report: SizeCheck) -> None:
    add_watch_findings(watch, report)
    op = watch.last_op or "unknown op"
    first = str(exc).splitlines()[0] if str(exc) else ""
    kind = "sync" if _SYNC_MESSAGE in str(exc) else "capture_failure"
    what = ("host synchronisation" if kind == "sync"
            else "a capture-breaking call (often a host synchronisation)")
    report.add(kind, f"{what} inside capture at op '{op}'{SYNC_OPS.get(op, '')}: "
                     f"{type(exc).__name__}: {first}; "
                     f"traceback tail: {traceback.format_exc().splitlines()[-1]}")


def _listed(items: list[str], limit: int = 5) -> str:
    counts = Counter(items)
    shown = [f"{item}" + (f" x{c}" if c > 1 else "") for item, c in list(counts.items())[:limit]]
    more = len(counts) - limit
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def _allocations() -> int:
    return torch.cuda.memory_stats().get("allocation.all.allocated", 0)
