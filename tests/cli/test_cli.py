"""The command line as a user meets it: every bad argument exits 2 with one line naming it,
before anything else is said; help in plain text for every flag; one unit per concept; a
verdict line and ``--json`` where a result is printed; fallbacks that say why."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys

import pytest
import torch
from helpers.paths import ROOT

import staticattn.reference.swa as swa_reference
from staticattn.__main__ import main
from staticattn.cli import ExitCode, build_parser

CUDA = torch.cuda.is_available()

BAD = [
    (["demo", "--steps", "0"], "argument --steps: must be >= 1, got 0"),
    (["demo", "--steps", "-3"], "argument --steps: must be >= 1, got -3"),
    (["demo", "--steps", "x"], "argument --steps: expected an integer, got 'x'"),
    (["demo", "--seed", "-1"], "argument --seed: must be in [0, 4294967295], got -1"),
    (["demo", "--dcp", "0"], "argument --dcp: must be >= 2, got 0"),
    (["demo", "--dcp", "1"], "argument --dcp: must be >= 2, got 1"),
    (["check", "--next-n", "0"], "argument --next-n: must be in [1, 16], got 0"),
    (["check", "--max-model-len", "0"], "argument --max-model-len: must be >= 1, got 0"),
    (["check", "--batches", "0"], "argument --batches: must be >= 1, got 0"),
    (["check", "--batch-requests", "0"], "argument --batch-requests: must be >= 1, got 0"),
    (["check", "--batch-requests", "257"], "--batch-requests 257: at most 256 requests fit"),
    (["check", "--seed", "-1"], "argument --seed: must be in [0, 4294967295], got -1"),
    (["bench", "--reps", "0"], "argument --reps: must be >= 1, got 0"),
    (["bench", "--dcp", "0"], "argument --dcp: must be >= 2, got 0"),
    (["bench", "--context", "0"], "argument --context: must be >= 1, got 0"),
    (["bench", "--context", "4096", "--max-model-len", "2048"],
     "--context 4096: beyond --max-model-len 2048"),
    (["check", "--max-model-len", "100"],
     "max_model_len=100 is below block_size=256"),
    (["bench", "--mix", "--breakdown"], "--mix and --breakdown: one bench at a time"),
    (["bench", "--mix", "--batch-requests", "4"],
     "--mix times fixed steps of its own: --batch-requests would be ignored"),
    (["bench", "--breakdown", "--consumer", "gather"],
     "--breakdown times fixed steps of its own: --consumer would be ignored"),
    (["bench", "--dcp", "2", "--next-n", "3", "--staging-guard", "step"],
     "--dcp times fixed steps of its own: --staging-guard, --next-n would be ignored"),
    (["bench", "--plot", "p.png", "--breakdown"], "--plot: --breakdown has no plot"),
    (["bench", "--step", "os:getcwd", "--consumer", "gather"],
     "--step and --consumer gather: one step at a time"),
    (["check", "--step", "nosuchmodule:fn"],
     "--step nosuchmodule:fn: cannot import 'nosuchmodule': ModuleNotFoundError"),
    (["check", "--step", "os:path"], "--step os:path: os.path is a module, not a function"),
    (["check", "--step", "os:nosuch"], "--step os:nosuch: module 'os' has no attribute"),
    (["bench", "--step", "os"], "--step 'os': expected MODULE:FUNCTION"),
    (["demo", "--dcp", "2", "--dcp-deadline", "0"], "--dcp-deadline: must be >= 1, got 0"),
    # Renamed flags have no aliases, not even as abbreviations of their new names.
    (["bench", "--batch", "1"], "unrecognized arguments: --batch 1"),
    (["check", "--sizes", "2"], "unrecognized arguments: --sizes 2"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_argument_exits_2_naming_it_before_anything_else(argv, message, capsys):
    with pytest.raises(SystemExit) as done:
        main(argv)
    out, err = capsys.readouterr()
    assert done.value.code == 2
    assert out == ""  # nothing said first: no "no CUDA", no demo banner
    last = err.strip().splitlines()[-1]
    # The command's parser names itself; an unknown flag is the top-level parser's.
    assert re.match(rf"staticattn( {argv[0]})?: error: ", last), err
    assert message in last, err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv", [["check", "--step", "nosuchmodule:fn"],
                                  ["check", "--step", "os:path"]])
def test_a_bad_step_is_named_without_a_traceback_as_a_user_runs_it(argv):
    done = subprocess.run([sys.executable, "-m", "staticattn", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert "Traceback" not in done.stderr
    assert f"--step {argv[-1]}: " in done.stderr


def test_a_step_whose_function_fails_is_a_typed_error():
    from staticattn.__main__ import _make_step
    from staticattn.errors import StepSpecError

    with pytest.raises(StepSpecError, match=r"--step os:getcwd: getcwd\(config\) raised "
                                             r"TypeError"):
        _make_step("os:getcwd", object())


def _flags(parser: argparse.ArgumentParser):
    """``(command, action)`` of every flag of every command."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        for action in command._actions:
            if action.option_strings and action.dest != "help":
                yield name, action


def test_every_flag_has_plain_help():
    parser = build_parser()
    flags = list(_flags(parser))
    assert len(flags) > 25
    for name, action in flags:
        assert action.help and len(action.help) > 10, (name, action.option_strings)
        for markup in ("``", ":class:", ":func:", ":mod:", ":data:"):
            assert markup not in action.help, (name, action.option_strings, action.help)
    for text in [parser.format_help()] + [c.format_help() for c in next(
            a for a in parser._actions
            if isinstance(a, argparse._SubParsersAction)).choices.values()]:
        assert "``" not in text and ":class:" not in text


def test_batch_sizes_are_requests_in_every_command():
    """One unit per concept: batch sizes in requests (``--batch-requests``) wherever a
    command takes them, contexts in tokens; no flag left counting tokens as a batch size."""
    names = {(cmd, opt) for cmd, action in _flags(build_parser())
             for opt in action.option_strings}
    assert {("check", "--batch-requests"), ("bench", "--batch-requests")} <= names
    assert not {opt for _, opt in names} & {"--batch", "--sizes"}
    bench = {a.dest: a for c, a in _flags(build_parser()) if c == "bench"}
    assert "tokens" in bench["context"].help and "requests" in bench["batch_requests"].help


@pytest.mark.skipif(CUDA, reason="without CUDA only: the GPU run measures")
def test_bench_without_cuda_says_skipped_in_text_or_json(capsys):
    """Skipped has its own exit status (3), apart from a bad argument's (2)."""
    assert main(["bench"]) == ExitCode.SKIPPED == 3
    assert capsys.readouterr().out.startswith("SKIPPED: no CUDA device; ")
    assert main(["bench", "--json"]) == 3
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "skipped" and "needs one" in data["reason"]


def test_exit_statuses_are_distinct_and_documented():
    assert [int(c) for c in ExitCode] == [0, 1, 2, 3]
    text = build_parser().format_help()
    assert "Exit status: 0 pass, 1 fail, 2 bad argument" in text and "3 skipped" in text


def test_the_demo_ends_with_a_verdict_and_prints_json(capsys, tmp_path):
    assert main(["demo", "--steps", "3", "--no-progress"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    if not CUDA:
        assert lines[-1] == ("PASS: 3 steps, 3 checked against the reference build and 3 "
                             "against the reference, 0 mismatches")
        assert any(line.startswith("steps 3: replayed 0 (0 through token buckets), eager 3 "
                                   "(not-captured 3)") for line in lines)
    assert lines[-1].startswith("PASS: 3 steps")
    assert main(["demo", "--steps", "3", "--no-progress", "--json"]) == 0
    out, err = capsys.readouterr()
    data = json.loads(out)  # only JSON on stdout; the text went to stderr
    assert data["verdict"] == "PASS" and data["steps"] == 3 and data["reference_checked"] >= 1
    assert data["mismatches"] == 0 and "PASS: 3 steps" in err
    path = tmp_path / "demo.json"
    assert main(["demo", "--steps", "2", "--no-progress", "--json", str(path)]) == 0
    assert json.loads(path.read_text())["steps"] == 2
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("PASS: 2 steps")


def test_the_demo_fails_when_a_build_differs_from_the_reference(monkeypatch, capsys):
    """The check is live: a reference that disagrees in one field fails the demo, naming it."""
    expected_for_step = swa_reference.expected_for_step

    def off_by_one(cfg, step):
        exp = expected_for_step(cfg, step)
        exp.token_to_req_indices = [b + 1 for b in exp.token_to_req_indices]
        return exp

    monkeypatch.setattr(swa_reference, "expected_for_step", off_by_one)
    assert main(["demo", "--steps", "2", "--no-progress"]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("FAIL: 2 steps")
    assert any(line.startswith("first mismatch: swa: token_to_req_indices[0]: got 0, "
                                   "expected 1") for line in lines)


@pytest.mark.skipif(CUDA, reason="without CUDA only: there the real consumers cannot run")
def test_the_demo_says_what_it_falls_back_to_and_why(capsys):
    assert main(["demo", "--steps", "1", "--no-progress", "--consumer", "real"]) == 0
    out = capsys.readouterr().out
    assert ("--consumer real: no real consumer can run here (deep_gemm: deep_gemm needs a "
            "CUDA device") in out
    assert "falling back to the built-in gather consumer" in out
    assert "consumer step: built-in gather consumer" in out


def test_help_imports_no_torch():
    done = subprocess.run([sys.executable, "-c",
                           "import sys\nfrom staticattn.__main__ import main\n"
                           "try:\n    main(['bench', '--help'])\nexcept SystemExit:\n    pass\n"
                           "print('torch' in sys.modules)"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "False", done.stdout + done.stderr


def test_the_dcp_deadline_reaches_every_rank(monkeypatch):
    """``--dcp-deadline`` is the deadline the demo's ranks join with (30 s unless given)."""
    import staticattn.distributed.dcp_demo as dcp_demo

    seen = []
    monkeypatch.setattr(dcp_demo, "run_dcp_demo", lambda world, **kw: seen.append(kw) or 0)
    assert main(["demo", "--dcp", "2", "--dcp-deadline", "5"]) == 0
    assert main(["demo", "--dcp", "2"]) == 0
    assert [kw["deadline"].total_seconds() for kw in seen] == [5, 30]
