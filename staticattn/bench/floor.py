"""The floor of any replay: a graph of one small kernel, timed on the GPU and on the host.

* GPU: CUDA events around a replay (:func:`replay_gpu_us`);
* host: the wall time of launching it, through ``cudaGraphLaunch`` (the raw launch the graph
  manager uses) and through ``CUDAGraph.replay()``, each on an idle device
  (:func:`launch_host_us`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from staticattn.bench.bench_report import Stat
from staticattn.graphs.capturer import capture, warm_up
from staticattn.graphs.graph_launch import make_launcher

__all__ = ["gpu_times_us", "host_times_us", "launch_floor", "launch_host_us",
           "replay_gpu_times_us", "replay_gpu_us"]


def gpu_times_us(fn: Callable[[], None], reps: int = 500,
                 before: Callable[[], None] | None = None, inner: int = 1,
                 warmup: int = 20) -> list[float]:
    """GPU time of each of ``reps`` calls of ``fn`` (CUDA events around it, us), each on an
    idle device, after ``warmup`` calls; ``before()``, untimed, ahead of each. With
    ``inner`` > 1 a sample is the mean of that many back-to-back calls between one pair of
    events: a delay at the start (a peer rank arriving late at a collective) is then spread
    over them."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gpu = []
    for _ in range(reps):
        if before is not None:
            before()
        torch.cuda.synchronize()
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        gpu.append(start.elapsed_time(end) * 1e3 / inner)
    return gpu


def replay_gpu_times_us(graph: torch.cuda.CUDAGraph, reps: int = 500,
                        before: Callable[[], None] | None = None,
                        inner: int = 1) -> list[float]:
    """:func:`gpu_times_us` of the graph's replays (20 of warm-up)."""
    return gpu_times_us(graph.replay, reps, before, inner)


def replay_gpu_us(graph: torch.cuda.CUDAGraph, reps: int = 500) -> Stat:
    """:func:`replay_gpu_times_us` as median, min and max."""
    return Stat.of(replay_gpu_times_us(graph, reps))


def host_times_us(fn, reps: int, before: Callable[[], None] | None = None) -> list[float]:
    """Host wall time of each of ``reps`` calls of ``fn()`` (us), each on an idle device
    (without CUDA: back to back); ``before()``, untimed, ahead of each."""
    cuda = torch.cuda.is_available()
    host = []
    for _ in range(reps):
        if before is not None:
            before()
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e6)
    return host


def launch_host_us(launch, reps: int = 500) -> Stat:
    """Host wall time of ``launch()`` (us) after 20 calls of warm-up, each call on an idle
    device."""
    for _ in range(20):
        launch()
    return Stat.of(host_times_us(launch, reps))


def launch_floor(reps: int = 500) -> dict[str, Stat]:
    """The one-kernel floor from one graph in one process: ``gpu_us``, ``replay_host_us``
    and, with cuda-bindings, ``raw_launch_host_us`` (what a step's launch is compared to)."""
    x = torch.zeros(1024, dtype=torch.int32, device="cuda")  # what the graph writes
    stream = torch.cuda.Stream()
    warm_up(lambda: x.add_(1), stream)
    graph, _ = capture(lambda: x.add_(1), stream)
    raw, how = make_launcher(graph, torch.cuda.current_stream())
    floor = {"gpu_us": replay_gpu_us(graph, reps),
             "replay_host_us": launch_host_us(graph.replay, reps)}
    if how == "cudaGraphLaunch":
        floor["raw_launch_host_us"] = launch_host_us(raw, reps)
    return floor
