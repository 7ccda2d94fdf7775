"""Warm up, then capture: the one way staticattn records a CUDA graph."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from staticattn.graphs.introspect import new_graph

__all__ = ["warm_up", "capture"]


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
    with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode=error_mode):
        result = fn()
    if getattr(graph, "raw_cuda_graph", None) is not None and hasattr(graph, "instantiate"):
        try:
            graph.instantiate()
        except RuntimeError:
            pass  # torch versions that instantiate in capture_end refuse a second one
    torch.cuda.synchronize()
    return graph, result
