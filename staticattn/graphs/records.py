"""Per-graph capture records, the lookup from a step to its graph, and per-step results."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["CapturedGraph", "GraphTable", "RunResult", "RunStats", "describe_graphs",
           "slice_outputs"]

DECODE, MIXED = "decode", "mixed"


@dataclass(slots=True)
class CapturedGraph:
    """One captured graph: what it serves, what the capture returned, and its figures.

    ``kind`` is "decode" (a uniform decode step of up to ``num_reqs`` requests, ``size =
    num_reqs * next_n`` tokens) or "mixed" (any step of up to ``num_reqs`` requests and
    ``size`` tokens). ``launch()`` replays it on the manager's stream (``how`` says through
    what: "cudaGraphLaunch" or "replay"). ``pool_bytes`` is what its capture added to the
    graph pool it shares (the largest graph, captured first, holds most of it; those
    after reuse that memory), so the graphs' sum is the pool's size.
    """

    kind: str
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


class GraphTable:
    """Which graph serves a step: list lookups, no search (they run on every step).

    ``decode[k]``: the smallest decode graph of at least ``k`` requests; ``mixed[t]``: the
    smallest token bucket of at least ``t`` tokens (its request slots are checked by the
    caller). None where no graph fits.
    """

    __slots__ = ("decode", "mixed")

    def __init__(self, graphs: dict[int, CapturedGraph], mixed: dict[int, CapturedGraph],
                 max_reqs: int, max_tokens: int) -> None:
        self.decode = _smallest_at_least({g.num_reqs: g for g in graphs.values()}, max_reqs)
        self.mixed = _smallest_at_least(mixed, max_tokens)


def _smallest_at_least(by_key: dict[int, CapturedGraph], top: int) -> list:
    table: list[CapturedGraph | None] = [None] * (top + 1)
    for key in sorted(by_key, reverse=True):
        for i in range(min(key, top) + 1):
            table[i] = by_key[key]
    return table


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
    #: "decode" or "mixed" for a replay.
    graph_kind: str | None = None

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
    mixed_replays: int = 0
    eager: Counter = field(default_factory=Counter)

    @property
    def eager_total(self) -> int:
        return sum(self.eager.values())

    def count_replay(self, kind: str) -> None:
        """Count one replay of a graph of ``kind`` ("decode" or "mixed")."""
        if kind == DECODE:
            self.replays += 1
        else:
            self.mixed_replays += 1


def describe_graphs(graphs: dict[int, CapturedGraph], mixed: dict[int, CapturedGraph],
                    stats: RunStats) -> str:
    """A table per captured graph: kind, tokens, requests, capture time, nodes, pool
    memory, how it is launched; then the totals and the step counts."""
    lines = [f"{'kind':>6} {'tokens':>6} {'reqs':>5} {'capture ms':>11} {'kernels':>8} "
             f"{'nodes':>6} {'pool MiB':>9}  launch"]
    records = [*sorted(mixed.values(), key=lambda g: g.size),
               *sorted(graphs.values(), key=lambda g: g.size)]
    for g in records:
        nodes = g.nodes or {}
        lines.append(
            f"{g.kind:>6} {g.size:>6} {g.num_reqs:>5} {g.capture_s * 1e3:>11.1f} "
            f"{nodes.get('kernel', '-'):>8} {sum(nodes.values()) if nodes else '-':>6} "
            f"{g.pool_bytes / 2**20:>9.2f}  {g.how}"
        )
    total = sum(g.pool_bytes for g in records)
    per_kind = ", ".join(
        f"{len(group)} {kind} in {sum(g.capture_s for g in group):.2f} s"
        for kind, group in (("mixed", list(mixed.values())), ("decode", list(graphs.values())))
        if group)
    lines.append(f"{len(records)} graphs, pool {total / 2**20:.2f} MiB, capture "
                 f"{sum(g.capture_s for g in records):.2f} s ({per_kind or 'none'})")
    lines.append(f"replays {stats.replays} decode + {stats.mixed_replays} mixed, "
                 f"eager {dict(stats.eager)}")
    return "\n".join(lines)


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
