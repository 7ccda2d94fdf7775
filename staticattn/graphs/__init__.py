"""Capture and replay: the GraphManager and its parts, its options, capture sizes, the
dispatcher that picks each step's graph, and what a captured graph holds."""

from staticattn.graphs.captured import CapturedGraph, EagerReason, GraphKind, RunResult
from staticattn.graphs.contexts import ContextGraphs
from staticattn.graphs.device_steps import DeviceLengthSteps
from staticattn.graphs.dispatch import StepKey
from staticattn.graphs.manager import GraphManager
from staticattn.graphs.options import EagerBuild, GraphOptions, StagingGuard
from staticattn.graphs.sizes import (
    default_capture_sizes,
    default_context_buckets,
    normalize_capture_sizes,
)

__all__ = [
    "CapturedGraph", "ContextGraphs", "DeviceLengthSteps", "EagerBuild", "EagerReason",
    "GraphKind", "GraphManager", "GraphOptions", "RunResult", "StagingGuard", "StepKey",
    "default_capture_sizes", "default_context_buckets", "normalize_capture_sizes",
]
