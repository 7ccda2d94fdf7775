"""Every command on every preset, in text and ``--json``: ``demo``, ``check`` and ``bench``,
5 presets x 3 commands x 2 output forms, run in process (``staticattn.__main__.main``) at a
small cost (a few steps, one random batch, a few reps).

Without CUDA: the demo runs eagerly, every step checked; ``check`` runs the checks that need
no capture on the step; ``bench`` says SKIPPED (exit 3). Under the ``gpu`` marker, on a GPU:
the demo replays graphs, ``check`` captures and probes, ``bench`` measures. Each ends with
its verdict, and the exit status says the same (0 pass, 1 fail, 3 skipped)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from staticattn.__main__ import main
from staticattn.cli import PRESETS, ExitCode

CUDA = torch.cuda.is_available()
FORMS = ["text", "json"]
#: The cheap flags of each command, per machine.
CPU_FLAGS = {"demo": ["--steps", "2"], "check": ["--batches", "1"], "bench": []}
GPU_FLAGS = {"demo": ["--steps", "3"], "check": ["--batch-requests", "1", "--batches", "2"],
             "bench": ["--batch-requests", "1", "--reps", "3"]}
VISION = "deepseek-v4-vision"


def test_the_matrix_is_every_preset():
    assert sorted(PRESETS) == ["deepseek-v3.2", "deepseek-v4", VISION, "deepseek-v4.1-flash",
                               "deepseek-v4.1-large"]


def _run(capsys, command: str, preset: str, form: str, flags: list[str]):
    argv = [command, "--preset", preset, "--no-progress", *flags]
    rc = main(argv + (["--json"] if form == "json" else []))
    out, err = capsys.readouterr()
    if form == "json":
        return rc, json.loads(out), err  # stdout holds the JSON alone
    return rc, out.strip().splitlines(), err


def _check_demo(rc, result, err, form: str, preset: str, steps: int) -> None:
    assert rc == ExitCode.PASS, (result, err)
    text = result if form == "text" else err.strip().splitlines()
    assert text[-1].startswith(f"PASS: {steps} steps, {steps} checked"), text[-5:]
    spans = [line for line in text if line.startswith("image spans: ")]
    if form == "json":
        assert result["verdict"] == "PASS" and result["steps"] == steps
        assert result["reference_checked"] >= 1 and result["mismatches"] == 0
        assert (result["image_spans"] >= 1) == (preset == VISION), result
    # The vision demo says how many image spans it ran, each step checked with them.
    assert bool(spans) == (preset == VISION), text
    if spans:
        assert spans[0].endswith("each step checked with its spans as above")


@pytest.mark.skipif(CUDA, reason="without CUDA only; the GPU run is the gpu-marked twin")
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("command", ["demo", "check", "bench"])
def test_every_command_on_every_preset_without_cuda(command, preset, form, capsys):
    rc, result, err = _run(capsys, command, preset, form, CPU_FLAGS[command])
    if command == "demo":
        _check_demo(rc, result, err, form, preset, 2)
    elif command == "check":
        assert rc == ExitCode.PASS, (result, err)
        if form == "text":
            assert result[0].startswith("no CUDA device: the checks that need no graph "
                                        f"capture, on the built-in gather consumer ({preset} ")
            assert any(line.startswith("needs a GPU (not checked here): host syncs")
                       for line in result)
            assert result[-1] == ("PASS without CUDA: 1 random steps run eagerly, 0 "
                                  "mismatches (the capture checks need a GPU)")
        else:
            assert result["schema"] == "staticattn.check-eager/1"
            assert (result["verdict"], result["preset"], result["steps"]) == ("PASS", preset, 1)
            assert result["compared"] and "staging races" in result["not_checked"]
    else:
        assert rc == ExitCode.SKIPPED
        if form == "text":
            assert result == ["SKIPPED: no CUDA device; replay latency (a GPU measurement) "
                              "needs one"]
        else:
            assert result["verdict"] == "skipped"


@pytest.mark.gpu
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("command", ["demo", "check", "bench"])
def test_every_command_on_every_preset_on_the_gpu(command, preset, form, capsys):
    rc, result, err = _run(capsys, command, preset, form, GPU_FLAGS[command])
    assert rc == ExitCode.PASS, (result, err)
    if command == "demo":
        _check_demo(rc, result, err, form, preset, 3)
        if form == "json":
            assert result["replayed"] == 3
    elif command == "check":
        if form == "text":
            assert re.match(r"PASS: 1 graphs captured, \d+ random batches replayed, 0 errors",
                            result[-1]), result
        else:
            assert result["schema"] == "staticattn.check/1" and result["verdict"] == "PASS"
    elif form == "text":
        assert any(f"preset {preset}" in line for line in result), result
    else:
        assert [row["num_reqs"] for row in result["rows"]] == [1]


def differing_step(config):
    """A step whose outputs differ on every call: ``check`` must fail it."""
    calls = []

    def step(batch, metadata):
        calls.append(1)
        return torch.full((batch.num_actual_tokens,), len(calls), device=config.torch_device)

    return step


@pytest.mark.skipif(CUDA, reason="without CUDA only: the check of the eager builds")
@pytest.mark.parametrize("form", FORMS)
def test_check_without_cuda_fails_a_step_that_differs(form, capsys):
    """The check runs the user's ``--step``: one whose outputs differ is a FAIL, exit 1."""
    rc, result, err = _run(capsys, "check", "deepseek-v3.2", form,
                           ["--batches", "2", "--step",
                            "test_commands_every_preset:differing_step"])
    assert rc == ExitCode.FAIL, (result, err)
    if form == "text":
        assert "test_commands_every_preset:differing_step" in result[0]
        assert result[-1].startswith("FAIL without CUDA: 2 random steps run eagerly, 4 ")
        assert "  the step's outputs, graph builds vs reference builds: 2 mismatches" in result
    else:
        assert result["verdict"] == "FAIL" and result["output_mismatches"] == 2
