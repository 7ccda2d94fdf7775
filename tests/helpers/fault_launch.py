"""Two ranks under torchrun, one of which fails on purpose (``distributed/dcp_fault_rank.py``,
``distributed/pcp_fault_rank.py``): the launch, bounded, and what each rank reported."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.paths import ROOT

#: No launch of two ranks takes this long (start-up included): past it the ranks are hung,
#: and the test fails instead of hanging the suite.
LAUNCH_TIMEOUT_S = 300
#: The step deadline the ranks run under: long enough for two CPU ranks on a loaded machine to
#: stay within it of each other.
DEADLINE_S = 5.0
#: A typed error comes within the deadline of its cause; this much more is scheduling.
SLACK_S = 5.0


def launch_faulty_ranks(script: Path, scenario: str, deadline_s: float
                        ) -> tuple[dict, dict, str]:
    """Each rank's records (its error, then how its process ended) and the output."""
    if torch.cuda.is_available() and torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs (NCCL takes one GPU per rank); the CPU run covers gloo")
    launch = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         "2", str(script), scenario, str(deadline_s)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        out, _ = launch.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(launch.pid, signal.SIGKILL)
        out, _ = launch.communicate()
        pytest.fail(f"the ranks hung past {LAUNCH_TIMEOUT_S} s:\n{out[-4000:]}")
    assert launch.returncode == 0, out[-4000:]
    records = [json.loads(line[len("FAULT "):]) for line in out.splitlines()
               if line.startswith("FAULT ")]
    errors = {r["rank"]: r for r in records if "error" in r}
    exits = {r["rank"]: r["exit"] for r in records if "exit" in r}
    assert sorted(exits) == [0, 1], out[-4000:]
    return errors, exits, out
