"""Graph-capture sanity checks: guards while capturing, replay probes, one report of errors
and notes (the pytest plugin lives in :mod:`staticattn.checks.pytest_plugin`)."""

from staticattn.checks.checker import StagingWriter, check_graph_safety
from staticattn.checks.findings import FAULT_KINDS, RULE, Finding
from staticattn.checks.outputs import same_outputs, snapshot_outputs
from staticattn.checks.report import SCHEMA_VERSION, CheckReport, SizeCheck

__all__ = ["CheckReport", "FAULT_KINDS", "Finding", "RULE", "SCHEMA_VERSION", "SizeCheck",
           "StagingWriter", "check_graph_safety", "same_outputs", "snapshot_outputs"]
