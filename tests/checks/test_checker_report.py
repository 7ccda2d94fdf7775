"""The checker's classification rule and its report, as text and as JSON (CPU only)."""

from __future__ import annotations

import json

import pytest

from staticattn.__main__ import main, print_check_report
from staticattn.checks import FAULT_KINDS, RULE, SCHEMA_VERSION, CheckReport, SizeCheck
from staticattn.checks.findings import ERROR, NOTE, Finding, finding, severity_of
from staticattn.errors import GraphError

#: The issue's classification, kind by kind: only graph-pool memory, graph-safe random
#: numbers and an optional extra of the report that could not be made are notes; everything
#: that makes replay differ from eager is an error.
EXPECTED_NOTES = {"pool_allocation", "library_allocation", "graph_safe_rng",
                  "extra_unavailable", "race_probe_inconclusive"}
EXPECTED_ERRORS = {
    "sync", "host_read", "replay_mismatch", "output_not_rewritten", "repointed",
    "stale_pointer", "arena_write", "staging_race", "rng_generator", "pool_reuse",
    "wrong_stream", "eager_failure", "capture_failure", "extent_mismatch", "frozen_branch",
    "frozen_value", "frozen_stride", "frozen_address",
}


def test_every_kind_is_classified_as_the_rule_says():
    assert set(FAULT_KINDS) == EXPECTED_NOTES | EXPECTED_ERRORS
    assert {k for k in FAULT_KINDS if severity_of(k) == NOTE} == EXPECTED_NOTES
    assert {k for k in FAULT_KINDS if severity_of(k) == ERROR} == EXPECTED_ERRORS
    for kind, fk in FAULT_KINDS.items():
        assert fk.title and fk.detected_by, kind
    with pytest.raises(KeyError):
        finding("no_such_kind", "x")


def test_the_rule_names_the_pool_note_and_the_errors():
    assert "valid until the next replay of any graph sharing the pool" in RULE
    for words in ("host read", "sync", "Python branch", "differs between capture and replay"):
        assert words in RULE, words


def _report(*kinds: str) -> CheckReport:
    s8 = SizeCheck(8, nodes={"kernel": 3, "event_record": 1}, replays=20)
    s16 = SizeCheck(16, replays=20, mismatches=1 if "replay_mismatch" in kinds else 0)
    for kind in kinds:
        if kind != "general":
            s16.add(kind, f"a {kind} finding")
    return CheckReport([s8, s16], [finding("repointed", "arena moved")]
                       if "general" in kinds else [])


def test_notes_alone_pass():
    report = _report("pool_allocation", "graph_safe_rng")
    assert report.ok and not report.errors and not report.failures
    assert [f.kind for f in report.notes] == ["pool_allocation", "graph_safe_rng"]
    text = str(report)
    assert text.splitlines()[-1] == ("PASS: 2 graphs captured, 40 random batches replayed, "
                                     "0 errors (2 notes)")
    assert "note: [pool_allocation] a pool_allocation finding" in text
    rule = text[text.index("rule: "):text.rindex("\n")]
    assert " ".join(rule.split()) == f"rule: {RULE}"
    assert all(len(line) <= 100 for line in rule.splitlines())
    report.raise_on_failure()


def test_one_error_fails_and_is_listed_with_its_size():
    report = _report("pool_allocation", "host_read")
    assert not report.ok
    assert report.failures == ["size 16: [host_read] a host_read finding"]
    assert report.kinds("error") == {"host_read"} and report.kinds("note") == {"pool_allocation"}
    lines = str(report).splitlines()
    assert lines[-1] == ("FAIL: 2 graphs captured, 40 random batches replayed, 1 errors "
                         "(1 notes)")
    assert any(line.split()[0] == "16" and line.endswith("FAIL") for line in lines)
    assert any(line.split()[0] == "8" and line.endswith("ok") for line in lines)
    with pytest.raises(GraphError, match="host_read"):
        report.raise_on_failure()


def test_a_general_finding_counts():
    report = _report("general")
    assert not report.ok and report.failures == ["[repointed] arena moved"]


def _check_finding(f: dict, size) -> None:
    assert set(f) == {"kind", "severity", "message", "size"}
    assert f["kind"] in FAULT_KINDS and f["severity"] == FAULT_KINDS[f["kind"]].severity
    assert isinstance(f["message"], str) and f["size"] == size


@pytest.mark.parametrize("kinds", [("pool_allocation",), ("replay_mismatch", "pool_allocation"),
                                   ("general",), ()])
def test_json_schema(kinds):
    report = _report(*kinds)
    data = json.loads(report.to_json())
    assert set(data) == {"schema", "verdict", "rule", "errors", "notes", "sizes", "findings"}
    assert data["schema"] == SCHEMA_VERSION and data["rule"] == RULE
    assert data["verdict"] == ("PASS" if report.ok else "FAIL")
    assert (data["errors"], data["notes"]) == (len(report.errors), len(report.notes))
    assert [s["size"] for s in data["sizes"]] == [8, 16]
    for s, sc in zip(data["sizes"], report.sizes):
        assert set(s) == {"size", "verdict", "replays", "mismatches", "nodes", "dot_path",
                          "findings"}
        assert s["verdict"] == ("ok" if sc.ok else "FAIL")
        assert (s["replays"], s["mismatches"]) == (sc.replays, sc.mismatches)
        assert s["nodes"] is None or all(isinstance(v, int) for v in s["nodes"].values())
        for f in s["findings"]:
            _check_finding(f, s["size"])
    for f in data["findings"]:
        _check_finding(f, None)
    total = sum(len(s["findings"]) for s in data["sizes"]) + len(data["findings"])
    assert total == data["errors"] + data["notes"]


def test_finding_to_dict_round_trips():
    f = finding("stale_pointer", "freed", 4)
    assert Finding(**f.to_dict()) == f and f.severity == ERROR


def test_check_command_prints_json_or_text(capsys, tmp_path):
    assert print_check_report(_report("pool_allocation"), "-") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "PASS"
    path = tmp_path / "report.json"
    assert print_check_report(_report("sync"), str(path)) == 1
    assert capsys.readouterr().out.splitlines()[-1].startswith("FAIL")
    assert json.loads(path.read_text())["verdict"] == "FAIL"


def test_check_command_accepts_json_without_cuda(capsys):
    """Without CUDA ``check`` runs the checks that need no capture and still prints JSON
    alone on stdout (every preset, both forms: tests/test_commands_every_preset.py)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("without CUDA only: the check itself runs in the GPU tests")
    argv = ["check", "--preset", "deepseek-v3.2", "--batches", "1", "--no-progress"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)  # JSON on stdout, nothing else
    assert out["verdict"] == "PASS" and out["schema"] == "staticattn.check-eager/1"
    assert "staging races" in out["not_checked"]

