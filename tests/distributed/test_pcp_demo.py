"""The prefill-context-parallel demo and bench as a user starts them: torchrun, one process
a rank. On CPU the ranks join over gloo and run every step eagerly (the same body a graph
holds); on GPUs over NCCL, every step replaying the rank's captured graph. Either way every
rank's restored step must equal the single-GPU step and its metadata the oracle; a refused
configuration is a typed error before any rank starts."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from helpers.paths import ROOT

from staticattn.__main__ import main
from staticattn.graphs.introspect import cudart_or_none

STEPS = 10


def _torchrun(world: int, *args: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         str(world), "-m", "staticattn", *args, "--no-progress"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    return done.returncode, done.stdout + done.stderr


def _needs_gpus_or_none(world: int) -> None:
    if torch.cuda.is_available() and torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs (NCCL takes one GPU per rank); the CPU run covers "
                    "gloo")


def _check_demo(world: int, code: int, out: str) -> None:
    assert code == 0, out[-4000:]
    assert (f"PASS: {world} ranks x {STEPS} steps checked against the single-GPU step and "
            "the oracle, 0 mismatches") in out, out[-4000:]
    ranks = re.findall(r"rank (\d): replayed (\d+)/(\d+), (\d+) tokens checked", out)
    assert [int(r) for r, *_ in ranks] == list(range(world)), out[-4000:]
    cuda = torch.cuda.is_available()
    # Every preset captures on CUDA (V4.1 too, although the reference runs it eagerly).
    assert ("graphs (NCCL)" if cuda else "eager (gloo, no CUDA)") in out
    for _, replayed, steps, tokens in ranks:
        assert int(steps) == STEPS and int(replayed) == (STEPS if cuda else 0)
        assert int(tokens) > STEPS  # prefills were drawn, not only single decodes


@pytest.mark.multigpu
def test_two_ranks_under_torchrun_equal_the_single_gpu_step():
    _needs_gpus_or_none(2)
    _check_demo(2, *_torchrun(2, "demo", "--pcp", "2", "--steps", str(STEPS)))


@pytest.mark.multigpu
def test_two_ranks_sharding_the_kv_equal_the_single_gpu_step():
    """With single-module MTP's decode rows of up to 2 tokens."""
    _needs_gpus_or_none(2)
    code, out = _torchrun(2, "demo", "--pcp", "2", "--dcp", "2", "--pcp-next-n", "2",
                          "--steps", str(STEPS))
    _check_demo(2, code, out)
    assert "PCP demo (deepseek-v3.2, DCP 2, next-n 2)" in out


@pytest.mark.multigpu
def test_deepseek_v41_under_torchrun_equals_the_single_gpu_step():
    _needs_gpus_or_none(2)
    code, out = _torchrun(2, "demo", "--pcp", "2", "--pcp-preset", "deepseek-v4.1-flash",
                          "--steps", str(STEPS))
    _check_demo(2, code, out)


@pytest.mark.multigpu
def test_four_ranks_under_torchrun_equal_the_single_gpu_step():
    _needs_gpus_or_none(4)
    _check_demo(4, *_torchrun(4, "demo", "--pcp", "4", "--steps", str(STEPS)))


@pytest.mark.multigpu
@pytest.mark.parametrize("preset", ["deepseek-v3.2", "deepseek-v4.1-flash"])
def test_the_bench_reports_every_rank_and_the_collectives(tmp_path, preset):
    """V4.1's single-GPU twin takes the window group's slots (its blocks are not the main
    table's), as the demo's does."""
    _needs_gpus_or_none(2)
    out_json = tmp_path / "pcp.json"
    code, out = _torchrun(2, "bench", "--pcp", "2", "--pcp-preset", preset, "--reps", "5",
                          "--json", str(out_json))
    assert code == 0, out[-4000:]
    data = json.loads(out_json.read_text())
    rows = data["rows"]
    assert [(r["requests"], r["rank"]) for r in rows] == [
        (k, r) for k in (1, 4, 8) for r in (0, 1, "spread")]
    for row in rows:
        if row["rank"] == "spread":
            assert 0 <= row["host_spread_50"] <= row["host_spread_99"]
            continue
        assert row["host_50"] > 0 and row["host_99"] >= row["host_50"]
        assert row["collectives_50"] > 0 and row["host_1gpu_50"] > 0
        if torch.cuda.is_available():
            assert row["gpu_50"] > 0 and 0 < row["collective_share"]
        # The graphs' kernel nodes: on GPUs with cuda-python both graphs', else none.
        counted = torch.cuda.is_available() and cudart_or_none() is not None
        assert (row["kernels"] is not None) == counted
        if counted:
            assert row["kernels"] > 0 and row["kernels_1gpu"] > 0
    assert "host spread across ranks per step" in out


def _refused(argv: list[str], capsys) -> str:
    """The command line's stderr for ``argv``, which it must refuse with exit 2 before any
    rank starts (nothing on stdout). In process: argparse refuses before anything runs."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and out == ""
    return err


@pytest.mark.parametrize(("args", "says"), [
    (["--pcp-preset", "deepseek-v4"], "ConfigError: PCP requires attention backend support"),
    (["--pcp-preset", "deepseek-v4-vision"],
     "ConfigError: PCP requires attention backend support"),
    (["--pcp-preset", "deepseek-v4.1-flash", "--dcp", "2"],
     "ConfigError: DeepSeek-V4.1 PCP currently requires PP=DP=DCP=1"),
    (["--pcp-preset", "deepseek-v4.1-flash", "--pcp-next-n", "2"],
     "speculation=mtp"),
])
@pytest.mark.parametrize("cmd", ["demo", "bench"])
def test_a_refused_configuration_is_a_typed_error_before_any_rank_starts(cmd, args, says,
                                                                        capsys):
    err = _refused([cmd, "--pcp", "2", *args], capsys)
    assert says in err, err


@pytest.mark.parametrize("cmd", ["demo", "bench"])
def test_a_dcp_group_neither_empty_nor_the_pcp_group_is_refused(cmd, capsys):
    err = _refused([cmd, "--pcp", "2", "--dcp", "3"], capsys)
    assert "ConfigError: When PCP is enabled, DCP must be disabled, span the PCP axis" in err


@pytest.mark.parametrize("cmd", ["demo", "bench"])
def test_pcp_next_n_without_pcp_is_refused(cmd, capsys):
    err = _refused([cmd, "--pcp-next-n", "2"], capsys)
    assert "--pcp-next-n: only a --pcp run reads it" in err


def test_the_demo_says_how_to_launch_it_without_torchrun():
    done = subprocess.run([sys.executable, "-m", "staticattn", "demo", "--pcp", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in {**os.environ, "PYTHONPATH": str(ROOT)}.items()
                               if k != "WORLD_SIZE"})
    assert done.returncode == 2
    assert "torchrun --nproc-per-node 2 -m staticattn demo --pcp 2" in done.stdout
