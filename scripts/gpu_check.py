"""The GPU check: the README's test command (the whole suite, with the public-API state
machine at its long length, ``STATICATTN_STATEFUL_STEPS=5000`` steps per preset, where the
default run has 300), then the GPU extras -- the demo, the sanity check and a short bench --
and one summary line at the end.

Run it on a machine with a CUDA device (``./dev.sh gpu-check``); every stage's output goes to
the terminal and, with ``--log-dir``, to one log file per stage. Exit code 0 only when every
stage passed.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The state machine's steps per preset in the tests stage (tests/graphs/test_stateful_api_gpu.py).
STATEFUL_STEPS = "5000"
#: The exit status without CUDA: skipped, as the command line's (staticattn.cli.ExitCode).
SKIPPED = 3

STAGES = {
    # -rfEs: every failure, error and skip reason in the summary; a test past 300 s has its
    # stack dumped (still running), so a hang is named in the log.
    "tests": [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs",
              "-o", "faulthandler_timeout=300"],
    "demo": [sys.executable, "-m", "staticattn", "demo", "--no-progress"],
    "check": [sys.executable, "-m", "staticattn", "check"],
    "bench": [sys.executable, "-m", "staticattn", "bench", "--batch-requests", "1", "32",
              "--reps", "50", "--no-progress"],
}


def _run(name: str, cmd: list[str], log_dir: Path | None) -> tuple[int, str, float]:
    print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
    t0 = time.perf_counter()
    env = {**os.environ, "STATICATTN_STATEFUL_STEPS": os.environ.get(
        "STATICATTN_STATEFUL_STEPS", STATEFUL_STEPS)}
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        lines.append(line)
    rc = proc.wait()
    out = "".join(lines)
    if log_dir is not None:
        (log_dir / f"{name}.log").write_text(out)
    return rc, out, time.perf_counter() - t0


def _test_counts(out: str) -> str:
    """``"612 passed, 3 skipped"`` from pytest's last summary line."""
    tail = [line for line in out.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    if not tail:
        return "no summary"
    return re.sub(r"^=+ | in [\d.]+s.*$|=+$", "", tail[-1]).strip()


def _xdist_mode() -> str:
    """``worksteal`` where pytest-xdist has it (3.2+), else ``load``."""
    try:
        import xdist
    except ImportError:
        sys.exit("gpu-check --workers needs pytest-xdist (pip install pytest-xdist)")
    version = tuple(int(p) for p in re.findall(r"\d+", xdist.__version__)[:2])
    return "worksteal" if version >= (3, 2) else "load"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--log-dir", type=Path, default=None)
    parser.add_argument("--skip", nargs="*", default=[], choices=sorted(STAGES))
    parser.add_argument("--workers", type=int, default=0,
                        help="run the tests in N processes (pytest-xdist, work stealing: the "
                        "long GPU differential tests spread over the workers); 0: one")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("SKIPPED: gpu-check: no CUDA device here; run ./dev.sh test for the CPU suite")
        return SKIPPED
    if args.log_dir is not None:
        args.log_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for name, cmd in STAGES.items():
        if name in args.skip:
            continue
        if name == "tests" and args.workers:
            cmd = [*cmd, "-n", str(args.workers), "--dist", _xdist_mode()]
        rc, out, seconds = _run(name, cmd, args.log_dir)
        what = _test_counts(out) if name == "tests" else ("ok" if rc == 0 else f"exit {rc}")
        results.append((name, rc, what, seconds))
    device = torch.cuda.get_device_name()
    summary = "; ".join(f"{name} {what} ({seconds:.0f} s)" for name, _, what, seconds in results)
    ok = all(rc == 0 for _, rc, _, _ in results)
    print(f"gpu-check {'PASS' if ok else 'FAIL'} on {device}: {summary}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
