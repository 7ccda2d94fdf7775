"""Graph manager (capture per size, shared pool, pad, stage, replay, eager fallback),
sanity checks, randomized steps and the replay-latency benchmark."""

from staticattn.graphs.checker import CheckReport, check_graph_safety
from staticattn.graphs.introspect import dump_dot, node_census
from staticattn.graphs.manager import CapturedGraph, GraphManager, RunResult
from staticattn.graphs.sizes import default_capture_sizes, normalize_capture_sizes

__all__ = [
    "CapturedGraph", "CheckReport", "GraphManager", "RunResult", "check_graph_safety",
    "default_capture_sizes", "dump_dot", "node_census", "normalize_capture_sizes",
]
