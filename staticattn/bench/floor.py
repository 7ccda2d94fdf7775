"""The floor of any replay: a graph of one small kernel, timed on the GPU."""

from __future__ import annotations

import torch

from staticattn.bench.report import Stat
from staticattn.graphs.capture import capture, warm_up

__all__ = ["one_kernel_replay_us", "replay_gpu_us"]


def one_kernel_replay_us(reps: int = 500) -> Stat:
    """GPU time of replaying a graph of one small kernel: the floor of any replay."""
    x = torch.zeros(1024, dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    warm_up(lambda: x.add_(1), stream)
    g, _ = capture(lambda: x.add_(1), stream)
    return replay_gpu_us(g, reps)


def replay_gpu_us(graph: torch.cuda.CUDAGraph, reps: int = 500) -> Stat:
    """GPU time of one replay (CUDA events around it, us), each on an idle device, after
    20 replays of warm-up."""
    for _ in range(20):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gpu = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        gpu.append(start.elapsed_time(end) * 1e3)
    return Stat.of(gpu)
