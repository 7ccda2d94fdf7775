"""Capture and replay: the GraphManager, capture sizes, and what a captured graph holds."""

from staticattn.graphs.contexts import ContextGraphs, default_context_buckets
from staticattn.graphs.device_steps import DeviceLengthSteps
from staticattn.graphs.introspect import dump_dot, node_census
from staticattn.graphs.manager import GraphManager
from staticattn.graphs.records import CapturedGraph, RunResult
from staticattn.graphs.sizes import default_capture_sizes, normalize_capture_sizes

__all__ = [
    "CapturedGraph", "ContextGraphs", "DeviceLengthSteps", "GraphManager", "RunResult",
    "default_capture_sizes", "default_context_buckets", "dump_dot", "node_census",
    "normalize_capture_sizes",
]
