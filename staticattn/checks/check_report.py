"""The checker's report: findings per captured size, as text for people and JSON for CI.

JSON schema (``CheckReport.to_dict()``, version :data:`SCHEMA_VERSION`)::

    {
      "schema": "staticattn.check/1",
      "verdict": "PASS" | "FAIL",          # FAIL iff at least one error
      "rule": str,                          # the classification rule (findings.RULE)
      "errors": int, "notes": int,
      "sizes": [{"size": int,               # tokens of the captured graph
                 "verdict": "ok" | "FAIL",
                 "replays": int, "mismatches": int,
                 "nodes": {str: int} | null,   # node census by type
                 "dot_path": str | null,
                 "findings": [Finding]}],
      "findings": [Finding]                 # findings about the whole check (size null)
    }
    Finding = {"kind": str, "severity": "error" | "note", "message": str, "size": int | null}
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field

from staticattn.checks.findings import ERROR, NOTE, RULE, Finding, finding
from staticattn.errors import GraphError

__all__ = ["CheckReport", "SCHEMA_VERSION", "SizeCheck"]

SCHEMA_VERSION = "staticattn.check/1"


@dataclass(slots=True)
class SizeCheck:
    """Findings for one captured size (tokens)."""

    size: int
    findings: list[Finding] = field(default_factory=list)
    nodes: dict[str, int] | None = None
    replays: int = 0
    mismatches: int = 0
    dot_path: str | None = None

    def add(self, kind: str, message: str) -> None:
        """Record a finding of ``kind`` (severity from :data:`FAULT_KINDS`) for this size."""
        self.findings.append(finding(kind, message, self.size))

    @property
    def ok(self) -> bool:
        return not any(f.severity == ERROR for f in self.findings)

    def to_dict(self) -> dict:
        """This size's results as a JSON-ready dict."""
        return {
            "size": self.size, "verdict": "ok" if self.ok else "FAIL",
            "replays": self.replays, "mismatches": self.mismatches, "nodes": self.nodes,
            "dot_path": self.dot_path, "findings": [f.to_dict() for f in self.findings],
        }


@dataclass(slots=True)
class CheckReport:
    """Every size's findings plus the findings about the whole check (``general``)."""

    sizes: list[SizeCheck]
    general: list[Finding] = field(default_factory=list)

    @property
    def findings(self) -> list[Finding]:
        return [f for s in self.sizes for f in s.findings] + list(self.general)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def notes(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == NOTE]

    @property
    def ok(self) -> bool:
        """True (verdict PASS) when no finding is an error; notes do not fail a check."""
        return not self.errors

    @property
    def failures(self) -> list[str]:
        """The errors as lines, ``"size 8: [kind] message"``."""
        return [("" if f.size is None else f"size {f.size}: ") + f"[{f.kind}] {f.message}"
                for f in self.errors]

    def kinds(self, severity: str | None = None) -> set[str]:
        """The kinds found (of one severity when given)."""
        return {f.kind for f in self.findings if severity in (None, f.severity)}

    def __str__(self) -> str:
        lines = [f"{'tokens':>6} {'replays':>8} {'mismatch':>9} {'kernels':>8} {'nodes':>6}  "
                 "verdict"]
        for s in self.sizes:
            n = s.nodes or {}
            lines.append(
                f"{s.size:>6} {s.replays:>8} {s.mismatches:>9} {n.get('kernel', '-'):>8} "
                f"{sum(n.values()) if n else '-':>6}  {'ok' if s.ok else 'FAIL'}"
            )
            lines += [f"       {f.severity}: [{f.kind}] {f.message}" for f in s.findings]
            if s.nodes:
                lines.append("       nodes: " + ", ".join(f"{k}={v}" for k, v in sorted(n.items())))
        lines += [f"  {f.severity}: [{f.kind}] {f.message}" for f in self.general]
        lines += textwrap.wrap(f"rule: {RULE}", 100, subsequent_indent="  ")
        errors, notes = len(self.errors), len(self.notes)
        checked = (f"{len(self.sizes)} graphs captured, "
                   f"{sum(s.replays for s in self.sizes)} random batches replayed")
        lines.append(f"PASS: {checked}, 0 errors ({notes} notes)" if self.ok
                     else f"FAIL: {checked}, {errors} errors ({notes} notes)")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """The report as plain data (the module docstring gives the schema)."""
        return {
            "schema": SCHEMA_VERSION, "verdict": "PASS" if self.ok else "FAIL", "rule": RULE,
            "errors": len(self.errors), "notes": len(self.notes),
            "sizes": [s.to_dict() for s in self.sizes],
            "findings": [f.to_dict() for f in self.general],
        }

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON (schema in the module docstring)."""
        return json.dumps(self.to_dict(), indent=indent)

    def raise_on_failure(self) -> None:
        """Raise :class:`GraphError` listing the failures when the verdict is FAIL."""
        if not self.ok:
            raise GraphError("graph sanity check failed:\n" + "\n".join(self.failures))
