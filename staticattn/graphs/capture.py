"""Warm up, then capture: the one way staticattn records a CUDA graph."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import torch

from staticattn.arena import Arena
from staticattn.errors import GraphError
from staticattn.graphs.introspect import new_graph, node_census
from staticattn.graphs.launch import cuda_index, draws_random_numbers, make_launcher
from staticattn.graphs.records import CapturedGraph

__all__ = ["arena_contents_kept", "capture", "capture_failed", "capture_record", "frozen_gc",
           "pool_bytes", "progress", "warm_up"]


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


def capture_record(kind: str, size: int, num_reqs: int, stage: Callable[[], None],
                   body: Callable[[], tuple[Any, Any]], *, capture_stream: torch.cuda.Stream,
                   pool, stream: torch.cuda.Stream, raw_launch: bool) -> CapturedGraph:
    """Stage the minimal step (``stage``), warm ``body`` up, capture it into ``pool`` and
    make its launcher (raw unless ``raw_launch`` is off or the body draws random numbers,
    which only ``replay()`` advances). ``body`` returns ``(outputs, metadata)``."""
    device = capture_stream.device
    mem0 = pool_bytes(pool, device)
    t0 = time.perf_counter()
    stage()
    _, draws = warm_up(lambda: draws_random_numbers(body, device), capture_stream)
    graph, (outputs, metadata) = capture(body, capture_stream, pool=pool)
    launch, how = make_launcher(graph, stream, raw=raw_launch and not draws)
    return CapturedGraph(
        kind=kind, size=size, num_reqs=num_reqs, graph=graph, outputs=outputs,
        metadata=metadata, capture_s=time.perf_counter() - t0,
        pool_bytes=pool_bytes(pool, device) - mem0,
        nodes=node_census(graph), launch=launch, how=how,
    )


def pool_bytes(pool, device: torch.device) -> int:
    """Bytes the caching allocator holds on ``device`` for the graph pool ``pool`` (a
    ``torch.cuda.graph_pool_handle()``; 0 for None): the sizes of the segments it owns.
    The device's reserved memory cannot tell: ``torch.cuda.graph`` empties the cache before
    each capture, so the pool grows while the total may shrink."""
    if pool is None:
        return 0
    index, want = cuda_index(device), tuple(pool)
    return sum(s["total_size"] for s in torch.cuda.memory_snapshot()
               if s["device"] == index and tuple(s.get("segment_pool_id", ())) == want)


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
