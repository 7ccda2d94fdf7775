"""What a captured graph is (the kind of step it serves, its record) and what a step returns."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["CapturedGraph", "EagerReason", "GraphKind", "RunResult", "slice_outputs"]


class GraphKind(enum.Enum):
    """The kinds of step, and of the graphs that serve them: every table that differs per
    kind is keyed by it. ``DECODE``: a uniform decode step (every request ``next_n``
    tokens); ``MIXED``: a step of any composition within a token bucket;
    ``DEVICE_LENGTHS``: a step whose query lengths a device kernel decides
    (:class:`~staticattn.graphs.DeviceLengthSteps`)."""

    DECODE = "decode"
    MIXED = "mixed"
    DEVICE_LENGTHS = "device-lengths"


class EagerReason(enum.Enum):
    """Why a step ran eagerly (:class:`~staticattn.graphs.dispatch.Dispatcher`)."""

    #: No graph was captured that a step of its kind could replay.
    NOT_CAPTURED = "not-captured"
    #: Graphs of its kind were captured, none large enough.
    TOO_LARGE = "too-large"
    #: A step with a prefill, and no token bucket captured.
    PREFILL = "prefill"
    #: Decodes of unequal query lengths, and no token bucket captured.
    NON_UNIFORM = "non-uniform"
    #: The caller asked for an eager build (``run(..., eager=...)``).
    FORCED = "forced"


@dataclass(slots=True)
class CapturedGraph:
    """One captured graph: what it serves, what the capture returned, and its figures.

    ``kind`` is ``GraphKind.DECODE`` (a uniform decode step of up to ``num_reqs`` requests,
    ``size = num_reqs * next_n`` tokens, whose sequences are at most ``context_len`` long) or
    ``MIXED`` / ``DEVICE_LENGTHS`` (any step of up to ``num_reqs`` requests and ``size``
    tokens). ``launch()`` replays it on the pool's replay stream (``how`` says through what:
    "cudaGraphLaunch" or "replay"); ``replays`` counts the steps the dispatcher sent to it.
    ``pool_bytes`` is what its capture added to the graph pool it shares (the largest graph,
    captured first, holds most of it; those after reuse that memory), so the graphs' sum is
    the pool's size.
    """

    kind: GraphKind
    size: int
    num_reqs: int
    graph: torch.cuda.CUDAGraph
    outputs: Any
    metadata: dict[str, Any]
    capture_s: float
    pool_bytes: int
    nodes: dict[str, int] | None
    launch: Callable[[], None]
    how: str
    context_len: int = 0
    replays: int = 0
    sliced: dict[int, Any] = field(default_factory=dict)
    results: dict[int, RunResult] = field(default_factory=dict)

    def outputs_for(self, num_tokens: int) -> Any:
        """The outputs sliced to the first ``num_tokens`` rows (views made once per count:
        slicing a tensor costs over a microsecond)."""
        out = self.sliced.get(num_tokens)
        if out is None:
            out = self.sliced[num_tokens] = slice_outputs(self.outputs, num_tokens)
        return out

    def result_for(self, num_tokens: int) -> RunResult:
        """The :class:`RunResult` of an untimed replay of a ``num_tokens``-token step, made
        once per count: it holds only views and this graph's figures, the same every
        replay (like the outputs, it describes the latest step)."""
        res = self.results.get(num_tokens)
        if res is None:
            res = self.results[num_tokens] = RunResult(
                self.outputs_for(num_tokens), "graph", self.size, None, num_tokens, None,
                self.kind)
        return res


@dataclass(slots=True)
class RunResult:
    """One step: its outputs for the real tokens, and how it ran."""

    outputs: Any
    mode: str  # "graph" or "eager"
    graph_size: int | None = None
    reason: EagerReason | None = None
    num_tokens: int = 0
    #: CUDA events around the step's device work (manager built with ``time_gpu=True``).
    gpu_events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None
    #: The replayed graph's kind (None for an eager step).
    graph_kind: GraphKind | None = None

    def gpu_us(self) -> float | None:
        """GPU time of the step in microseconds (synchronises on its end event)."""
        if self.gpu_events is None:
            return None
        start, end = self.gpu_events
        end.synchronize()
        return start.elapsed_time(end) * 1e3


def slice_outputs(outputs: Any, num_tokens: int) -> Any:
    """``outputs`` (a tensor, or a tuple, list or dict of them) cut to ``num_tokens`` rows."""
    if outputs is None:
        return None
    if isinstance(outputs, torch.Tensor):
        return outputs[:num_tokens]
    if isinstance(outputs, tuple | list):
        return type(outputs)(slice_outputs(o, num_tokens) for o in outputs)
    if isinstance(outputs, dict):
        return {k: slice_outputs(v, num_tokens) for k, v in outputs.items()}
    return outputs
