"""``scripts/rank_host_spread.py``: its per-step records measure what they name, its summary
counts what it says, and it runs under torchrun (gloo ranks on CPU, NCCL on two GPUs)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from helpers.paths import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import rank_host_spread as spread  # noqa: E402


@pytest.fixture
def clock():
    c = spread.StepClock()
    yield c
    c.close()


def test_a_sleeping_step_is_off_cpu_and_a_busy_one_is_not(clock):
    slept = clock.time(lambda: time.sleep(0.02))
    assert slept[0] >= 20_000 and slept[0] - slept[1] >= 15_000  # wall, not CPU time
    assert slept[2] >= 1  # sleeping gives the CPU up: a voluntary switch

    def spin():  # 20 ms of this thread's CPU time, however long the wall clock takes
        end = time.thread_time() + 0.02
        while time.thread_time() < end:
            pass

    busy = clock.time(spin)
    assert busy[1] >= 20_000 and busy[0] >= busy[1] - 100  # the wall holds the CPU time


def test_a_collection_in_the_step_is_counted(clock):
    assert clock.time(gc.collect)[3] >= 1
    assert clock.time(lambda: None)[3] == 0
    record = clock.time(lambda: None)
    assert len(record) == len(spread.FIELDS) and record[4] >= -1 and record[5] >= -1


def test_the_probe_is_timed_after_the_step_not_in_it(clock):
    clock.probe = lambda: time.sleep(0.02)
    record = clock.time(lambda: None)
    assert record[6] >= 20_000 and record[0] < 20_000 and spread.FIELDS[6] == "probe_us"


def test_the_summary_spreads_over_ranks_and_counts_steps():
    # (world 2, reps 3, FIELDS): wall, cpu, switches, gc, cpu before, after, probe
    records = np.array([
        [[10, 9, 0, 0, 1, 1, 5], [30, 10, 1, 0, 1, 1, 6], [20, 19, 0, 0, 1, 3, 7]],
        [[14, 13, 0, 1, 2, 2, 9], [31, 30, 0, 0, 2, 2, 12], [20, 20, 0, 0, 1, 1, 30]],
    ], dtype=np.float64)
    s = spread.summarize(records)
    assert s["spread_p50"] == 1.0 and s["cpu_spread_p50"] == 4.0  # spreads 4, 1, 0 / 4, 20, 1
    assert s["off_cpu_p50"] == [1.0, 1.0] and s["off_cpu_p99"][0] == 19.6  # 1, 20, 1: 1 + 0.98 * 19
    assert s["steps_switched"] == 1 and s["steps_collecting"] == 1 and s["steps_moved"] == 1
    assert s["steps_sharing_a_core"] == 1  # step 3: both ranks on CPU 1
    assert s["cpus"] == [[1], [1, 2]]
    assert s["probe_p50"] == [6.0, 12.0]
    # The probes' p5 over both ranks is 5.25: full speed is below 6.825. Rank 1 (9, 12, 30)
    # never ran at it, so no step did.
    assert s["full_speed_steps"] == 0 and s["full_speed_spread_p99"] is None
    records[1, :, 6] = [5, 6, 6]  # rank 1 fast throughout: steps 1 and 2 (rank 0's 5, 6)
    s = spread.summarize(records)
    assert s["full_speed_steps"] == 2 and s["full_speed_spread_p50"] == 2.5  # spreads 4, 1
    records[:, :, 4] = -1  # no sched_getcpu: no CPU known, so no core shared
    assert spread.summarize(records)["steps_sharing_a_core"] == 0


def test_it_runs_under_torchrun(tmp_path):
    if torch.cuda.is_available() and torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs (NCCL takes one GPU per rank); the CPU run covers gloo")
    out = tmp_path / "spread.json"
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         "2", "scripts/rank_host_spread.py", "--requests", "2", "--reps", "4",
         "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    report = json.loads(out.read_text())
    records = np.array(report["requests"]["2"]["records"])
    assert records.shape == (2, 4, len(spread.FIELDS))
    assert (records[..., 0] > 0).all() and (records[..., 1] >= 0).all()
    assert (records[..., 6] > 0).all()
    ranks = report["requests"]["2"]["ranks"]
    assert len(ranks) == 2 and all(r["cpu"] >= -1 and "threads" in r for r in ranks)
    assert "2 requests: host p50" in done.stdout and "rank 1: probe p50" in done.stdout


def test_each_rank_is_told_its_cpu_its_shares_and_its_core_s_other_thread(tmp_path,
                                                                         monkeypatch):
    monkeypatch.setattr(spread, "core_of", lambda cpus: {c: (c, c + 16) for c in cpus})
    shares = {1: {"busy": 1.0, "steal": 0.01}, 17: {"busy": 0.4, "steal": 0.0},
              2: {"busy": 0.9, "steal": 0.2}}
    windows = [{"cpus": shares, "mhz": {1: 2400.0}, "threads": [["pt_main", 1.0, 1]]},
               {"cpus": shares, "mhz": {}, "threads": []}]
    records = np.zeros((2, 3, len(spread.FIELDS)))
    records[0, :, 4] = [1, 1, 3]  # rank 0 started two of its three steps on CPU 1
    records[1, :, 4] = [2, 2, 2]
    one, two = spread.rank_cpus(windows, records)
    assert one == {"cpu": 1, "busy": 1.0, "steal": 0.01, "mhz": 2400.0, "sibling_busy": 0.4,
                   "threads": [["pt_main", 1.0, 1]]}
    assert two["cpu"] == 2 and two["steal"] == 0.2 and two["mhz"] is None
    assert two["sibling_busy"] is None  # CPU 18 is not in the census


def test_it_says_how_to_launch_it_without_torchrun(capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert spread.main([]) == 2
    assert "torchrun --nproc-per-node WORLD" in capsys.readouterr().out
