"""The runnable examples in ``examples/`` run as a user runs them: on CPU they say so and run
eagerly (or read the published figures); on a GPU every step of the loop replays a graph."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _run(module: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_custom_loop():
    out = _run("examples.custom_loop")
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert len(steps) == 200
    assert any("prefill chunks" in s and " 0 prefill" not in s for s in steps)
    assert "0 mismatches against the eager run" in out, out[-2000:]
    if torch.cuda.is_available():
        assert all("-> graph" in s for s in steps), out  # every step replays
        assert "(100%)" in out
    else:
        assert out.startswith("no CUDA") and all("-> eager" in s for s in steps)


def test_check_my_step():
    out = _run("examples.check_my_step", "--batches", "5")
    if torch.cuda.is_available():
        buggy, fixed = out.split("--- the step fixed:")
        assert "error: [sync]" in buggy and "FAIL (" in buggy, out
        assert "PASS (" in fixed and "error: [" not in fixed, out
        assert "the checker found the bug and passes the fix: True" in out
    else:
        assert out.startswith("no CUDA") and "same outputs eagerly: True" in out, out


def test_bench_replay(tmp_path):
    out = _run("examples.bench_replay", "--out", str(tmp_path / "bench.json"))
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert rows and all(float(r[-1]) > 1 for r in rows)  # eager costs more than a replay
    if torch.cuda.is_available():
        assert (tmp_path / "bench.json").exists()
    else:
        assert "no CUDA device" in out
