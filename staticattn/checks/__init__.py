"""Graph-capture sanity checks: guards while capturing, replay against eager, one report."""

from staticattn.checks.checker import CheckReport, check_graph_safety
from staticattn.checks.outputs import same_outputs, snapshot_outputs

__all__ = ["CheckReport", "check_graph_safety", "same_outputs", "snapshot_outputs"]
