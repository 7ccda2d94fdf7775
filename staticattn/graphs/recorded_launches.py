"""Recorded launches: a step no graph holds, run eagerly at the cost of its kernel launches.

The graph builds (staging kernels, every builder's ``build_decode`` / ``build_mixed``) are
graph-safe: at given extents -- kind, requests, tokens -- they launch the same kernels with
the same arguments (arena views at fixed addresses, ints derived from the extents) whatever
the step's values, which the kernels read on the device. That is what lets a graph replay
them; it also lets the host record them once per extents and launch them again through the
driver, without the builders' Python and Triton's argument binding, which cost several
times the driver call (``docs/results/launch_costs_h200.txt``).

Extents are recorded at their second step (the first runs the builds plainly and is only
noted): recording costs a few times a plain run, which a step whose extents never come back
should not pay. Recording runs the builds under stream capture (relaxed mode, on a side
stream; the graph is inspected, never instantiated) with every launch handed to a recorder
and frozen (:func:`~staticattn.kernels.runtime.frozen_launch.freeze`). The captured graph's node
census is the proof that the record is complete: as many kernel nodes as frozen launches,
as many event record nodes as recorded events, and nothing else. Device work that does not
go through the recorded launch path (a torch op, a library kernel), a launch that cannot be
frozen, or a capture that fails marks the extents unrecordable, and their steps keep the
ordinary eager builds. The recorded launches of one extents (:class:`FrozenBuilds`) hold the
``Batch`` and metadata the builds returned -- the views a replay at these extents uses --
and are dropped least recently used past ``capacity`` extents (extents seen once past four
times that).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from staticattn.builders.swa.tile_scheduler import renew_tile_scheduler_metas
from staticattn.graphs.captured import GraphKind
from staticattn.graphs.introspect import cudart_or_none, raw_node_census
from staticattn.graphs.python_gc import gc_paused
from staticattn.kernels.runtime.compiled_launch import recording
from staticattn.kernels.runtime.frozen_launch import FrozenLaunch, driver_or_none, freeze

__all__ = ["FrozenBuilds", "RecordedLaunchStats", "RecordedLaunches"]

Builds = Callable[[GraphKind, int, int], tuple[Any, dict[str, Any]]]
Extents = tuple[GraphKind, int, int]


class _EventRecord:
    """A recorded event record, issued on the stream of the launches beside it."""

    __slots__ = ("_event", "_record", "_success")

    def __init__(self, event: torch.cuda.Event) -> None:
        driver = driver_or_none()
        self._event = event  # kept alive with the recorded launches
        self._record = lambda stream, handle=event.cuda_event: driver.cuEventRecord(handle,
                                                                                    stream)
        self._success = driver.CUresult.CUDA_SUCCESS

    def launch(self, stream: int) -> None:
        err, = self._record(stream)
        if err != self._success:
            raise RuntimeError(f"cuEventRecord failed: {err}")


class _Recorder:
    """Collects a step's launches and event records, frozen, in order."""

    def __init__(self) -> None:
        self.actions: list[FrozenLaunch | _EventRecord] = []
        self.kernels = 0
        self.events = 0
        self.frozen = True

    def kernel(self, compiled, kernel, grid, args) -> None:
        frozen = freeze(compiled, kernel, grid, args)
        self.kernels += 1
        if frozen is None:
            self.frozen = False
        else:
            self.actions.append(frozen)

    def event(self, event: torch.cuda.Event) -> None:
        self.events += 1
        self.actions.append(_EventRecord(event))


@dataclass
class FrozenBuilds:
    """The frozen launches of one extents' graph builds, and what the builds returned."""

    actions: list[FrozenLaunch | _EventRecord]
    batch: Any
    metadata: dict[str, Any]

    def launch(self) -> None:
        """Issue every launch and event record, in order, on the current stream."""
        stream = torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice())
        for action in self.actions:
            action.launch(stream)


@dataclass
class RecordedLaunchStats:
    """Steps run through recorded launches, extents recorded, extents found unrecordable."""

    hits: int = 0
    recorded: int = 0
    unrecordable: int = 0


class RecordedLaunches:
    """Recorded launches by extents ``(kind, num_reqs, num_tokens)`` for ``builds``, which
    launches the graph builds at those extents and returns ``(batch, metadata)``."""

    def __init__(self, builds: Builds, capacity: int = 256) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._builds = builds
        self.capacity = capacity
        self._frozen: OrderedDict[Extents, FrozenBuilds | None] = OrderedDict()
        self._seen: OrderedDict[Extents, None] = OrderedDict()
        self._side: torch.cuda.Stream | None = None
        self._failures: dict[Extents, int] = {}
        self.stats = RecordedLaunchStats()

    @staticmethod
    def available() -> bool:
        """Recording needs CUDA and cuda-bindings (driver and runtime)."""
        return (torch.cuda.is_available() and driver_or_none() is not None
                and cudart_or_none() is not None)

    def __len__(self) -> int:
        return len(self._frozen)

    def clear(self, *, keep_seen: bool = False) -> None:
        """Drop every record (the manager closes); with ``keep_seen`` the extents stay
        noted, so their next step records them again."""
        if keep_seen:
            self._seen.update(dict.fromkeys(self._frozen))
            while len(self._seen) > 4 * self.capacity:
                self._seen.popitem(last=False)
        else:
            self._seen.clear()
        self._frozen.clear()

    def run(self, kind: GraphKind, num_reqs: int,
            num_tokens: int) -> tuple[Any, dict[str, Any]]:
        """Launch the graph builds at these extents -- plainly the first time, recording
        their launches the second, through the recorded launches after -- and return
        ``(batch, metadata)``."""
        key = (kind, num_reqs, num_tokens)
        records = self._frozen
        frozen = records.get(key, False)
        if frozen is False:
            if key not in self._seen:  # the first step at these extents: noted only
                self._seen[key] = None
                if len(self._seen) > 4 * self.capacity:
                    self._seen.popitem(last=False)
                return self._builds(kind, num_reqs, num_tokens)
            del self._seen[key]
            frozen = self._record(key)
        else:
            records.move_to_end(key)
            if frozen is not None:
                self.stats.hits += 1
        if frozen is None:
            return self._builds(kind, num_reqs, num_tokens)
        frozen.launch()
        # The builds made fresh tile-scheduler holders when recorded; a replay of their
        # launches does not, so each step gets fresh ones here (a filled holder keeps the
        # schedule of the step that filled it).
        for md in frozen.metadata.values():
            scheds = getattr(md, "tile_scheds", None)
            if scheds:
                renew_tile_scheduler_metas(scheds)
        return frozen.batch, frozen.metadata

    def _record(self, key: Extents) -> FrozenBuilds | None:
        """Record the launches for ``key`` and keep them (None: unrecordable, kept too). A
        capture that raises keeps nothing the first time: the ordinary builds then run (and
        raise again if the step itself is at fault)."""
        try:
            recorder, census, built = self._capture(key)
        except Exception:
            self._failures[key] = failures = self._failures.get(key, 0) + 1
            if failures < 2:
                return None
            recorder, census, built = _Recorder(), None, None
        complete = (built is not None and recorder.frozen and census is not None
                    and census.get("kernel", 0) == recorder.kernels
                    and census.get("event_record", 0) == recorder.events
                    and set(census) <= {"kernel", "event_record", "empty"})
        frozen = FrozenBuilds(recorder.actions, *built) if complete else None
        if frozen is None:
            self.stats.unrecordable += 1
        else:
            self.stats.recorded += 1
        self._frozen[key] = frozen
        if len(self._frozen) > self.capacity:
            self._frozen.popitem(last=False)
        return frozen

    def _capture(self, key: Extents):
        """Run the builds under a relaxed stream capture on a side stream, recording every
        launch: ``(recorder, node census or None, (batch, metadata) or None)``. Nothing runs
        on the device; the captured graph is destroyed."""
        cudart = cudart_or_none()
        success = cudart.cudaError_t.cudaSuccess
        if self._side is None:
            self._side = torch.cuda.Stream()
        side = self._side
        recorder = _Recorder()
        relaxed = cudart.cudaStreamCaptureMode.cudaStreamCaptureModeRelaxed
        # No collection mid-capture (python_gc says why); no full one before it either: this
        # capture runs the first time a step meets its extents, on the serving path.
        with gc_paused(), torch.cuda.stream(side):
            err, = cudart.cudaStreamBeginCapture(side.cuda_stream, relaxed)
            if err != success:
                return recorder, None, None
            try:
                allocations = _allocations(side.device)
                with recording(recorder):
                    built = self._builds(*key)
                if _allocations(side.device) != allocations:
                    # A build allocated: a frozen launch could keep the address of a tensor
                    # freed since (the capture is the runtime's, unknown to the allocator).
                    built = None
            finally:
                err, graph = cudart.cudaStreamEndCapture(side.cuda_stream)
                if err == success and graph is not None:
                    try:
                        census = raw_node_census(graph)
                    except RuntimeError:
                        census = None
                    cudart.cudaGraphDestroy(graph)
                else:
                    census = None
        return recorder, census, built


def _allocations(device: torch.device) -> int:
    """How many allocations the caching allocator has made on ``device`` so far."""
    return torch.cuda.memory_stats(device).get("allocation.all.allocated", 0)
