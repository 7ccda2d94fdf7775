"""Per-size capture records and per-step results of the graph manager."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["CapturedGraph", "RunResult", "RunStats", "slice_outputs"]


@dataclass(slots=True)
class CapturedGraph:
    """Per-size state: the graph, what the capture returned, and its figures."""

    size: int
    num_reqs: int
    graph: torch.cuda.CUDAGraph
    outputs: Any
    metadata: dict[str, Any]
    capture_s: float
    pool_bytes: int
    nodes: dict[str, int] | None


@dataclass(slots=True)
class RunResult:
    """One step: its outputs for the real tokens, and how it ran."""

    outputs: Any
    mode: str  # "graph" or "eager"
    graph_size: int | None = None
    reason: str | None = None
    num_tokens: int = 0
    #: CUDA events around the step's device work (manager built with ``time_gpu=True``).
    gpu_events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None

    def gpu_us(self) -> float | None:
        """GPU time of the step in microseconds (synchronises on its end event)."""
        if self.gpu_events is None:
            return None
        start, end = self.gpu_events
        end.synchronize()
        return start.elapsed_time(end) * 1e3


@dataclass(slots=True)
class RunStats:
    replays: int = 0
    eager: Counter = field(default_factory=Counter)

    @property
    def eager_total(self) -> int:
        return sum(self.eager.values())


def slice_outputs(outputs: Any, num_tokens: int) -> Any:
    if outputs is None:
        return None
    if isinstance(outputs, torch.Tensor):
        return outputs[:num_tokens]
    if isinstance(outputs, tuple | list):
        return type(outputs)(slice_outputs(o, num_tokens) for o in outputs)
    if isinstance(outputs, dict):
        return {k: slice_outputs(v, num_tokens) for k, v in outputs.items()}
    return outputs
