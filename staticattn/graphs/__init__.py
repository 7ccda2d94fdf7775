"""Capture and replay: the GraphManager and its parts, its options, capture sizes, and what a
captured graph holds."""

from staticattn.graphs.captured import CapturedGraph, GraphKind, RunResult
from staticattn.graphs.contexts import ContextBucket, ContextGraphs, default_context_buckets
from staticattn.graphs.device_steps import DeviceLengthSteps
from staticattn.graphs.introspect import dump_dot, node_census
from staticattn.graphs.manager import GraphManager
from staticattn.graphs.options import EagerBuild, GraphOptions, StagingGuard
from staticattn.graphs.pool import GraphPool
from staticattn.graphs.sizes import default_capture_sizes, normalize_capture_sizes

__all__ = [
    "CapturedGraph", "ContextBucket", "ContextGraphs", "DeviceLengthSteps", "EagerBuild",
    "GraphKind", "GraphManager", "GraphOptions", "GraphPool", "RunResult", "StagingGuard",
    "default_capture_sizes", "default_context_buckets", "dump_dot", "node_census",
    "normalize_capture_sizes",
]
