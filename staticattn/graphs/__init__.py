"""Capture and replay: the GraphManager, capture sizes, and what a captured graph holds."""

from staticattn.graphs.device_steps import DeviceLengthSteps
from staticattn.graphs.introspect import dump_dot, node_census
from staticattn.graphs.manager import GraphManager
from staticattn.graphs.records import CapturedGraph, RunResult
from staticattn.graphs.sizes import default_capture_sizes, normalize_capture_sizes

__all__ = [
    "CapturedGraph", "DeviceLengthSteps", "GraphManager", "RunResult", "default_capture_sizes",
    "dump_dot", "node_census", "normalize_capture_sizes",
]
