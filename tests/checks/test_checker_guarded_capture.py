"""What the guards saw, turned into findings (CPU: a watch filled by hand, a fake exception)."""

from __future__ import annotations

import torch

from staticattn.checks.check_report import SizeCheck
from staticattn.checks.guarded_capture import _capture_broke, add_watch_findings
from staticattn.checks.watch import CaptureWatch, TensorRef


def _findings(watch: CaptureWatch) -> dict[str, tuple[str, str]]:
    report = SizeCheck(8)
    add_watch_findings(watch, report)
    assert all(f.size == 8 for f in report.findings)
    return {f.kind: (f.severity, f.message) for f in report.findings}


def test_a_clean_watch_gives_no_finding():
    assert _findings(CaptureWatch(device_type="cpu")) == {}


def test_pool_allocations_are_one_note_naming_ops_and_phases():
    watch = CaptureWatch(device_type="cpu")
    kept = [torch.zeros(2), torch.zeros(3)]
    watch.allocations = [TensorRef.of(kept[0], "add", "step"), TensorRef.of(kept[1], "add", "step"),
                         TensorRef.of(kept[0], "empty", "build")]
    found = _findings(watch)
    assert set(found) == {"pool_allocation"}
    severity, message = found["pool_allocation"]
    assert severity == "note"
    assert message.startswith("3 allocations inside capture: add (step) x2, empty (build) x1")
    assert "valid until the next replay of any graph sharing the pool" in message


def test_each_kind_of_fault_is_one_error():
    watch = CaptureWatch(device_type="cpu")
    watch.host_reads = ["'_to_copy' reads a pinned host tensor int64[8]"] * 3
    watch.arena_writes = ["'add_' writes input.positions"]
    watch.wrong_stream = ["collective 'c10d.allreduce_' (step)"]
    watch.rng = [("uniform_", True), ("normal_", False)]
    found = _findings(watch)
    assert {k: s for k, (s, _) in found.items()} == {
        "host_read": "error", "arena_write": "error", "wrong_stream": "error",
        "rng_generator": "error"}
    assert found["host_read"][1] == "'_to_copy' reads a pinned host tensor int64[8] x3"
    assert found["rng_generator"][1].startswith("normal_:")


def test_default_generator_alone_is_a_note():
    watch = CaptureWatch(device_type="cpu")
    watch.rng = [("uniform_", True)]
    assert _findings(watch)["graph_safe_rng"][0] == "note"


def test_long_lists_are_cut():
    watch = CaptureWatch(device_type="cpu")
    watch.arena_writes = [f"'add_' writes buffer{i}" for i in range(9)]
    message = _findings(watch)["arena_write"][1]
    assert "buffer4" in message and "buffer5" not in message and message.endswith("4 more")


def _broke(exc: Exception, last_op: str) -> tuple[str, str]:
    watch = CaptureWatch(device_type="cpu")
    watch.ops = ["slice", last_op]
    report = SizeCheck(4)
    try:
        raise exc
    except Exception as caught:
        _capture_broke(caught, watch, report)
    (f,) = report.findings
    assert f.severity == "error"
    return f.kind, f.message


def test_a_sync_debug_error_is_a_named_sync():
    kind, message = _broke(RuntimeError("called a synchronizing CUDA operation"),
                           "_local_scalar_dense")
    assert kind == "sync"
    assert message.startswith("host synchronisation inside capture at op "
                              "'_local_scalar_dense' (.item() /"), message


def test_another_capture_error_is_a_capture_failure():
    kind, message = _broke(RuntimeError("operation not permitted when stream is capturing"),
                           "copy_")
    assert kind == "capture_failure" and "'copy_' (a copy to or from pageable" in message
