"""The decode-context-parallel demo and bench as a user starts them: torchrun, two
processes, one rank each. On CPU the ranks join over gloo and run every step eagerly; on two
GPUs over NCCL, every step replaying a captured graph. Either way every step of every rank
must equal the single-GPU step, and the bench reports every rank and the spread between
them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from helpers.paths import ROOT

STEPS = 12


def _needs_two_gpus_or_none() -> None:
    if torch.cuda.is_available() and torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs (NCCL takes one GPU per rank); the CPU run covers gloo")


@pytest.mark.multigpu
@pytest.mark.parametrize("preset", ["deepseek-v4", "deepseek-v3.2", "deepseek-v4.1-flash"])
def test_two_ranks_under_torchrun_equal_the_single_gpu_step(preset):
    _needs_two_gpus_or_none()
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         "2", "-m", "staticattn", "demo", "--dcp", "2", "--steps", str(STEPS),
         "--dcp-preset", preset],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "PASS: 2 ranks x 12 steps checked against the single-GPU step, 0 mismatches" in out, (
        out[-4000:])
    ranks = re.findall(r"rank (\d): replayed (\d+)/(\d+)", out)
    assert [r for r, _, _ in ranks] == ["0", "1"], out[-4000:]
    cuda = torch.cuda.is_available()
    assert ("graphs (NCCL)" if cuda else "eager (gloo, no CUDA)") in out
    for _, replayed, steps in ranks:
        assert int(steps) == STEPS and int(replayed) == (STEPS if cuda else 0)


@pytest.mark.multigpu
@pytest.mark.parametrize("preset", ["deepseek-v4", "deepseek-v4.1-flash"])
def test_the_bench_reports_every_rank_and_the_spread(tmp_path, preset):
    _needs_two_gpus_or_none()
    out_json = tmp_path / "dcp.json"
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         "2", "-m", "staticattn", "bench", "--dcp", "2", "--reps", "10", "--batch-requests", "1",
         "4", "--preset", preset, "--json", str(out_json)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    report = json.loads(out_json.read_text())
    ranks = [(r["batch"], r["rank"]) for r in report["rows"]]
    assert ranks == [(1, 0), (1, 1), (1, "spread"), (4, 0), (4, 1), (4, "spread")]
    cuda = torch.cuda.is_available()
    for row in report["rows"]:
        if row["rank"] == "spread":
            assert row["host_spread_50"] >= 0
            continue
        assert row["host_50"] > 0 and row["collectives_50"] > 0 and row["host_1gpu_50"] > 0
        assert row["floor_50"] > 0  # the same count of one-float all-gathers
        if cuda:
            assert row["gpu_50"] > 0  # no order asserted between two timings
        else:
            assert row["gpu_50"] is None
    assert "host spread across ranks per step" in out


def test_the_demo_says_how_to_launch_it_without_torchrun():
    done = subprocess.run([sys.executable, "-m", "staticattn", "demo", "--dcp", "2"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT),
                               "WORLD_SIZE": "1"})
    assert done.returncode == 2
    assert "torchrun --nproc-per-node 2 -m staticattn demo --dcp 2" in done.stdout


def test_rank_zeros_report_ends_with_a_verdict_or_prints_json(capsys, tmp_path):
    from staticattn.distributed.dcp_demo import _report

    totals = [(0, 12, (40.0, 60.0)), (1, 12, (41.0, 70.0))]  # (mismatches, replayed, p50/p99)
    _report(totals, "deepseek-v4", 2, 12, True, None)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == ("FAIL: 2 ranks x 12 steps checked against the single-GPU step, "
                         "1 mismatches")
    assert lines[2].startswith("rank 1: replayed 12/12") and lines[2].endswith("step 1")
    _report(totals[:1] * 2, "deepseek-v4", 2, 12, False, "-")
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "PASS" and data["mode"] == "eager (gloo, no CUDA)"
    assert [r["host_us_p99"] for r in data["ranks"]] == [60.0, 60.0]
    _report(totals, "deepseek-v4", 2, 12, True, str(tmp_path / "dcp.json"))
    assert json.loads((tmp_path / "dcp.json").read_text())["mismatches"] == 1
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("FAIL: ")


def test_the_host_spread_is_per_step_the_slowest_rank_less_the_fastest():
    """Three ranks, five steps: per step the spread is max - min over the ranks (not over
    the steps, nor one rank's own variation); p50 and p99 are numpy's over those five."""
    from staticattn.distributed.dcp_bench import host_spread

    hosts = [[10.0, 20.0, 30.0, 40.0, 50.0],
             [12.0, 20.0, 25.0, 40.0, 90.0],
             [11.0, 26.0, 30.0, 41.0, 50.0]]  # spreads 2, 6, 5, 1, 40
    p50, p99 = host_spread(hosts)
    assert p50 == 5.0
    assert p99 == pytest.approx(40.0 - 0.04 * (40.0 - 6.0))  # linear between 6 and 40
