"""``scripts/pcp_rank_phases.py``, the one-GPU census of a PCP rank's graph phases, runs:
on CPU every phase once (V3.2 under DCP, V4.1's several builders), with CUDA each captured,
counted and timed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from helpers.paths import ROOT


@pytest.mark.parametrize(("preset", "dcp", "builders"),
                         [("deepseek-v3.2", 2, ["indexer"]),
                          ("deepseek-v4.1-flash", 1, ["indexer.c1a", "indexer.c2a",
                                                      "compressed", "swa"])])
def test_every_phase_of_the_rank_runs(tmp_path, preset, dcp, builders):
    out = tmp_path / "phases.json"
    done = subprocess.run(
        [sys.executable, "scripts/pcp_rank_phases.py", "--world", "2", "--dcp", str(dcp),
         "--preset", preset, "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
        timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert list(report["phases"]) == ["split", *(f"build {b}" for b in builders), "layer",
                                      "body"]
    if torch.cuda.is_available():
        body = report["phases"]["body"]
        assert body["nodes"]["kernel"] >= report["phases"]["split"]["nodes"]["kernel"]
        assert body["gpu_us"] > 0 and report["one_gpu"]["gpu_us"] > 0
    else:
        assert all(v is None for v in report["phases"].values())
