"""Launching a captured graph at the cost of one driver call.

Most of the host time of ``torch.cuda.CUDAGraph.replay()`` is bookkeeping that a graph
without random-number ops does not need; ``cudaGraphLaunch`` on the graph's exec handle,
through cuda-bindings, skips it (docs/results/launch_costs_h200.txt compares the two).
:func:`make_launcher` returns the raw launch when it can, and ``replay()`` otherwise:

* cuda-bindings is missing (it is the optional ``cuda`` extra), or this torch does not
  expose the exec handle (``CUDAGraph.raw_cuda_graph_exec``);
* the captured work draws random numbers: ``replay()`` advances the generator's offset for
  every replay, and a raw launch would replay the same numbers each time
  (:func:`draws_random_numbers` tells, from an eager run of the same work).

Either way the graph runs on ``stream``, which the caller fixes once (the stream current
when the graphs were captured): looking the current stream up would cost more than the
launch itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from staticattn.errors import GraphError
from staticattn.graphs.introspect import cudart_or_none

__all__ = ["cuda_index", "draws_random_numbers", "make_launcher"]


def make_launcher(graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream, *,
                  raw: bool = True) -> tuple[Callable[[], None], str]:
    """``(launch, how)``: a zero-argument callable that launches ``graph`` on ``stream``, and
    ``"cudaGraphLaunch"`` or ``"replay"``."""
    cudart = cudart_or_none() if raw else None
    exec_handle = getattr(graph, "raw_cuda_graph_exec", None)
    if cudart is None or exec_handle is None:
        return _replay_on(graph, stream), "replay"
    try:
        handle = cudart.cudaGraphExec_t(init_value=int(exec_handle()))
    except (RuntimeError, TypeError):  # not instantiated yet, or a torch without the handle
        return _replay_on(graph, stream), "replay"
    stream_handle = cudart.cudaStream_t(init_value=stream.cuda_stream)
    graph_launch = cudart.cudaGraphLaunch
    success = cudart.cudaError_t.cudaSuccess

    def launch() -> None:
        err, = graph_launch(handle, stream_handle)
        if err != success:
            raise GraphError(f"cudaGraphLaunch failed: {err}")

    # The exec handle belongs to ``graph``: keep it alive as long as the launcher.
    launch.graph = graph  # type: ignore[attr-defined]
    return launch, "cudaGraphLaunch"


def _replay_on(graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream) -> Callable[[], None]:
    def launch() -> None:
        with torch.cuda.stream(stream):
            graph.replay()

    return launch


def draws_random_numbers(fn: Callable[[], Any], device: torch.device) -> tuple[Any, bool]:
    """Run ``fn`` (eagerly) and return ``(its result, whether it drew random numbers)``.

    It drew them when it advanced the philox offset of ``device``'s default CUDA generator:
    the one generator a capture registers, so the one ``replay()`` advances. Reading the
    offset costs nothing, where watching every op through a dispatch mode would slow the
    warm-up and, the first time, import torch's compiler stack (seconds)."""
    generator = torch.cuda.default_generators[cuda_index(device)]
    before = generator.get_offset()
    result = fn()
    return result, generator.get_offset() != before


def cuda_index(device: torch.device | str) -> int:
    """The index of the CUDA ``device`` ("cuda" alone: the current device's)."""
    device = torch.device(device)
    return device.index if device.index is not None else torch.cuda.current_device()
