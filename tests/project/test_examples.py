"""The runnable examples in ``examples/`` run as a user runs them, and each proves something
on either kind of machine: on CPU they check what runs without CUDA (the eager steps against
the reference builds and :mod:`staticattn.reference`) or read the published figures; on a GPU
every step of the loop replays a graph and the checker finds the planted bug."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import torch
from helpers.paths import ROOT


def _run(module: str, *args: str, cwd: Path = ROOT) -> str:
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, text=True,
                          capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_custom_loop():
    out = _run("examples.custom_loop")
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert len(steps) == 200
    assert any("prefill chunks" in s and " 0 prefill" not in s for s in steps)
    # Every step compared, twice: the counts are the steps run, not zero.
    assert "checked 200 steps against the reference builds (outputs): 0 mismatches" in out, out
    assert "checked 200 steps' metadata against staticattn.reference: 0 mismatches" in out, out
    assert out.splitlines()[-1] == "PASS: 200 steps checked, 0 mismatches"
    if torch.cuda.is_available():
        assert all("-> graph" in s for s in steps), out  # every step replays
        assert "(100%)" in out
    else:
        assert out.startswith("no CUDA") and all("-> eager" in s for s in steps)
        assert "eager steps: not-captured 200, forced 200" in out


def test_check_my_step():
    out = _run("examples.check_my_step", "--batches", "5")
    if torch.cuda.is_available():
        buggy, fixed = out.split("--- the step fixed:")
        assert "error: [sync]" in buggy and "FAIL: " in buggy, out
        assert "PASS: " in fixed and "error: [" not in fixed, out
        assert "the checker found the bug and passes the fix: True" in out
    else:
        assert out.startswith("no CUDA: running the checks that need no graph capture"), out
        for name in ("with the planted bug", "fixed"):
            part = out.split(f"--- the step {name}:")[1]
            assert part.lstrip().startswith("5 random steps run eagerly:"), out
            assert "graph builds vs reference builds: 0 mismatches" in part.split("---")[0]
            assert "metadata vs the reference (indexer, swa): 0 mismatches" in part, out
        assert "needs a GPU (not checked here): host syncs" in out
        assert out.splitlines()[-1].startswith("PASS without CUDA")


def test_bench_replay(tmp_path):
    plot = tmp_path / "bench.png"
    out = _run("examples.bench_replay", "--out", str(tmp_path / "bench.json"), "--plot",
               str(plot))
    lines = out.splitlines()
    # On a GPU the bench's own table (rows in tokens) comes first; the summary follows its
    # header line, one row per request count.
    summary = lines[next(i for i, line in enumerate(lines) if line.startswith("requests")):]
    rows = [line.split() for line in summary if line.strip()[:1].isdigit()]
    assert len(rows) >= 4 and all(float(r[-1]) > 1 for r in rows)  # eager costs more
    assert [int(r[0]) for r in rows] == sorted(int(r[0]) for r in rows)  # requests, rising
    if torch.cuda.is_available():
        assert (tmp_path / "bench.json").exists()
        assert f"measured here, on {torch.cuda.get_device_name()}" in out
    else:  # says that nothing was measured, and whose figures these are
        assert out.startswith("no CUDA device: nothing is measured here"), out
        assert "published, not this machine: NVIDIA H200" in out
        assert "(docs/results/bench_v4_h200.json):" in out
    if importlib.util.find_spec("matplotlib") is None:
        assert re.search(r"no plot: --plot \S+ needs matplotlib, the plot extra", out), out
        assert not plot.exists()
    else:
        assert plot.stat().st_size > 0 and f"plot: {plot}" in out

