"""Graph-capture sanity checks: guards while capturing, replay probes, one report of errors
and notes; the checks that need no graph (the builds against :mod:`staticattn.reference`);
the pytest plugin (:mod:`staticattn.checks.pytest_plugin`).

The names below are imported on first use (PEP 562): the pytest plugin, which every pytest
run of an environment holding staticattn loads, imports this package and nothing heavy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from staticattn.lazy import lazy_exports

#: Public name -> the module that defines it.
_EXPORTS = {
    "CheckReport": "staticattn.checks.check_report",
    "SCHEMA_VERSION": "staticattn.checks.check_report",
    "SizeCheck": "staticattn.checks.check_report",
    "FAULT_KINDS": "staticattn.checks.findings",
    "RULE": "staticattn.checks.findings",
    "Finding": "staticattn.checks.findings",
    "StagingWriter": "staticattn.checks.checker",
    "check_graph_safety": "staticattn.checks.checker",
    "same_outputs": "staticattn.checks.output_compare",
    "snapshot_outputs": "staticattn.checks.output_compare",
    "EagerCheck": "staticattn.checks.reference_check",
    "check_eagerly": "staticattn.checks.reference_check",
    "reference_mismatch": "staticattn.checks.reference_check",
}

__all__ = [
    "CheckReport", "EagerCheck", "FAULT_KINDS", "Finding", "RULE", "SCHEMA_VERSION", "SizeCheck",
    "StagingWriter", "check_eagerly", "check_graph_safety", "reference_mismatch", "same_outputs",
    "snapshot_outputs",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from staticattn.checks.check_report import SCHEMA_VERSION, CheckReport, SizeCheck
    from staticattn.checks.checker import StagingWriter, check_graph_safety
    from staticattn.checks.findings import FAULT_KINDS, RULE, Finding
    from staticattn.checks.output_compare import same_outputs, snapshot_outputs
    from staticattn.checks.reference_check import EagerCheck, check_eagerly, reference_mismatch
