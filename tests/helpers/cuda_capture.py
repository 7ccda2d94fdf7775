"""Capturing a body of graph-safe builds in a CUDA graph, for the GPU replay tests."""

from __future__ import annotations

import torch

from staticattn.graphs.python_gc import gc_paused


def capture(body):
    """``(graph, out)``: ``body()`` run once on a side stream (every kernel compiled outside
    the capture), then captured; ``out`` is the captured call's result, whose views the
    graph's replays rewrite."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = body()  # compiles every kernel outside the capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with gc_paused(), torch.cuda.graph(graph):  # why: staticattn.graphs.python_gc
        out = body()
    torch.cuda.synchronize()
    return graph, out
