"""One-line mutation run over kernels/, builders/ and graphs/: does a plausible small bug
fail the fast tests of the code it touches?

The mutants are chosen, not enumerated: for each file of :data:`TARGETS` the script lists
the code lines (no comments, docstrings or imports) holding an operator of :data:`SWAPS`
(a comparison, an off-by-one, ``min``/``max``, ``and``/``or``), draws ``count`` of them with
a fixed seed, and applies the line's first swap. Each mutant runs the file's own test
subset (``pytest -x``, Triton interpreted, bounded by ``--timeout``); a failure, an error or
a timeout kills it. The file is put back after each mutant, and in any case at exit.

Usage (from the repository root; one process, so it keeps to one core)::

    PYTHONPATH=$PWD python scripts/mutate.py [--seed 0] [--out docs/results/mutation_cpu.txt]
"""

from __future__ import annotations

import argparse
import ast
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: file -> (mutants drawn, the tests that exercise it).
TARGETS: dict[str, tuple[int, list[str]]] = {
    "staticattn/kernels/indexer/mqa_schedule.py": (3, ["tests/kernels/test_mqa_schedule.py"]),
    "staticattn/kernels/staging/stage_inputs.py": (3, ["tests/staging/test_staging.py",
                                                   "tests/validation/test_input_edges.py",
                                          "tests/validation/test_replay_fast_path.py"]),
    "staticattn/kernels/indexer/prefill_plan.py": (3, ["tests/validation/test_input_edges.py"]),
    "staticattn/kernels/indexer/index_slots.py": (2, ["tests/kernels/test_compressed_slots.py"]),
    "staticattn/kernels/swa/swa_rows.py": (2, ["tests/kernels/test_swa_kernels.py"]),
    "staticattn/validation/values.py": (3, ["tests/validation/test_validate.py",
                                                     "tests/validation/test_pool_bounds.py"]),
    "staticattn/validation/in_place_views.py": (3, ["tests/validation/test_replay_fast_path.py",
                                                    "tests/validation/test_pool_bounds.py"]),
    "staticattn/validation/block_ids.py": (2, ["tests/validation/test_pool_bounds.py"]),
    "staticattn/validation/host_arrays.py": (3, ["tests/validation/test_validate.py",
                                                   "tests/validation/test_replay_fast_path.py"]),
    "staticattn/builders/attention_utils/chunking.py": (
        2, ["tests/builders/attention_utils/test_chunking.py"]),
    "staticattn/graphs/table.py": (3, ["tests/validation/test_input_edges.py",
                                       "tests/graphs/test_graph_manager.py"]),
    "staticattn/graphs/runner.py": (3, ["tests/graphs/test_graph_manager.py",
                                        "tests/validation/test_pool_bounds.py",
                                        "tests/validation/test_input_edges.py"]),
    "staticattn/graphs/in_place.py": (2, ["tests/graphs/test_graph_manager.py",
                                          "tests/validation/test_pool_bounds.py"]),
    "staticattn/graphs/sizes.py": (2, ["tests/graphs/test_graph_manager.py",
                                       "tests/graphs/test_graph_options.py"]),
}

#: ``(pattern, replacement)``: the first that matches a line mutates it.
SWAPS: list[tuple[str, str]] = [
    (r" <= ", " < "), (r" >= ", " > "), (r" < ", " <= "), (r" > ", " >= "),
    (r" == ", " != "), (r" != ", " == "), (r" \+ 1\b", ""), (r" - 1\b", ""),
    (r"\bmin\(", "max("), (r"\bmax\(", "min("), (r" and ", " or "), (r" or ", " and "),
]


def _code_lines(path: Path) -> list[int]:
    """1-based numbers of lines outside docstrings, comments and imports."""
    source = path.read_text()
    skip: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(
                getattr(body[0], "value", None), ast.Constant) and isinstance(
                body[0].value.value, str):
            skip.update(range(body[0].lineno, body[0].end_lineno + 1))
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            skip.update(range(node.lineno, node.end_lineno + 1))
    lines = source.splitlines()
    return [i + 1 for i, line in enumerate(lines)
            if i + 1 not in skip and not line.lstrip().startswith("#")
            and any(re.search(p, line.split("#")[0]) for p, _ in SWAPS)]


def _mutate(line: str) -> str:
    code, sep, comment = line.partition("#")
    for pattern, replacement in SWAPS:
        if re.search(pattern, code):
            return re.sub(pattern, replacement, code, count=1) + sep + comment
    raise ValueError(line)


def _run_tests(tests: list[str], timeout: int) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "killed (timeout)"
    return "survived" if done.returncode == 0 else "killed"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=int, default=240)
    parser.add_argument("--out", default="docs/results/mutation_cpu.txt")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    results = []
    start = time.time()
    for rel, (count, tests) in TARGETS.items():
        path = ROOT / rel
        original = path.read_text()
        candidates = _code_lines(path)
        for number in sorted(rng.sample(candidates, min(count, len(candidates)))):
            lines = original.splitlines(keepends=True)
            before = lines[number - 1]
            lines[number - 1] = _mutate(before.rstrip("\n")) + "\n"
            try:
                path.write_text("".join(lines))
                verdict = _run_tests(tests, args.timeout)
            finally:
                path.write_text(original)
            results.append((rel, number, before.strip(), lines[number - 1].strip(), verdict))
            print(f"{verdict:>16}  {rel}:{number}  {before.strip()}  ->  "
                  f"{lines[number - 1].strip()}", flush=True)
    killed = sum(r[4].startswith("killed") for r in results)
    head = [f"one-line mutants, seed {args.seed}: {killed}/{len(results)} killed "
            f"({100 * killed / len(results):.0f}%), {time.time() - start:.0f} s",
            "verdict | file:line | original -> mutant"]
    body = [f"{v} | {f}:{n} | {a} -> {b}" for f, n, a, b, v in results]
    Path(ROOT / args.out).write_text("\n".join(head + body) + "\n")
    print(head[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
