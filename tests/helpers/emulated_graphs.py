"""Graphs for graph-manager tests on any device: captured on CUDA, emulated elsewhere by a
record whose launch runs the graph's body eagerly -- what its replay computes, through the
same lookup, staging and padding as a replay (on CPU no host branch or read back inside the
body is caught: the GPU run of the same test captures for real)."""

from __future__ import annotations

from collections.abc import Sequence

from helpers.support import DEVICE
from staticattn.graphs import CapturedGraph, GraphKind
from staticattn.graphs.capturer import GraphSpec

__all__ = ["BUCKETS", "SIZES", "emulated", "graphs_for"]

#: Decode graphs and token buckets (tokens) for the worked examples' geometry
#: (``v41_swa_steps.EXAMPLE_V41``: next_n 2, 4 requests, 32 tokens).
SIZES, BUCKETS = (2, 4, 8), (16, 32)


def emulated(spec: GraphSpec) -> CapturedGraph:
    """A record of ``spec`` whose launch runs its body eagerly (staged and run once first,
    as a capture does, for the outputs and metadata the record keeps)."""
    spec.stage()
    outputs, metadata = spec.body()
    return CapturedGraph(spec.kind, spec.size, spec.num_reqs, None, outputs, metadata, 0.0, 0,
                         None, spec.body, "eagerly", spec.context_len)


def graphs_for(gm, sizes: Sequence[int] = SIZES, buckets: Sequence[int] = BUCKETS) -> None:
    """Decode graphs of ``sizes`` (for every context bucket) and token buckets ``buckets``
    (tokens) for manager ``gm``: captured on CUDA, else emulated."""
    if DEVICE == "cuda":
        gm.capture(sizes, buckets)
        return
    cap = gm.capturer
    specs = [cap.spec(GraphKind.DECODE, c, size) for c in gm.contexts for size in sizes]
    specs += [cap.spec(GraphKind.MIXED, cap.context_len, size) for size in buckets]
    gm.dispatcher.add(*(emulated(spec) for spec in specs))
