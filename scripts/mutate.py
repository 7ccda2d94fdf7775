"""One-line mutation run over kernels/, builders/ and graphs/: does a plausible small bug
fail the fast tests of the code it touches?

Two sets of mutants. The hand-written ones of issue #46's bug classes
(``scripts/class_mutants.py``: file, exact original text, mutated text, the tests that must
kill it, and whether it is equivalent, with the reason) -- ``--classes [NAME ...]``. And a
random draw -- ``--draw``; both when neither is given. The score leaves the equivalent
mutants out.

The random mutants are chosen, not enumerated: for each file of :data:`TARGETS` the script lists
the code lines (no comments, docstrings or imports) holding an operator of :data:`SWAPS`
(a comparison, an off-by-one, ``min``/``max``, ``and``/``or``), draws ``count`` of them with
a fixed seed, and applies the line's first swap. Each mutant runs the file's own test
subset (``pytest -x``, Triton interpreted, bounded by ``--timeout``); a failure, an error or
a timeout kills it. The file is put back after each mutant, and in any case at exit.
Every test set runs once unmutated first: the run stops if one fails there.

Usage (from the repository root; one process, so it keeps to one core)::

    PYTHONPATH=$PWD python scripts/mutate.py [--classes [NAME ...]] [--draw] [--seed 0]
        [--out docs/results/mutation_cpu.txt]
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

from class_mutants import CLASS_MUTANTS, CLASSES, ClassMutant

ROOT = Path(__file__).resolve().parent.parent

#: file -> (mutants drawn, the tests that exercise it). Files are drawn in this order from
#: one seeded generator: a new file goes last, so the files before it keep their draws.
TARGETS: dict[str, tuple[int, list[str]]] = {
    "staticattn/kernels/indexer/mqa_schedule.py": (3, [
        "tests/kernels/test_mqa_schedule.py", "tests/kernels/test_mqa_schedule_tiles.py",
        "tests/kernels/test_mqa_schedule_padding.py"]),
    "staticattn/kernels/staging/stage_inputs.py": (3, [
        "tests/staging/test_staging.py", "tests/validation/test_input_edges.py",
        "tests/validation/test_replay_fast_path.py", "tests/staging/test_device_starts.py"]),
    "staticattn/kernels/indexer/prefill_plan.py": (3, [
        "tests/validation/test_input_edges.py", "tests/builders/indexer/test_dcp_indexer.py"]),
    "staticattn/kernels/indexer/index_slots.py": (2, [
        "tests/kernels/test_compressed_slots.py",
        "tests/builders/compressed/test_own_slot_zero.py"]),
    "staticattn/kernels/swa/swa_rows.py": (2, ["tests/kernels/test_swa_kernels.py",
                                               "tests/builders/swa/test_swa_oracle.py"]),
    "staticattn/validation/values.py": (3, ["tests/validation/test_validate.py",
                                            "tests/validation/test_pool_bounds.py"]),
    "staticattn/validation/in_place_views.py": (3, [
        "tests/validation/test_replay_fast_path.py", "tests/validation/test_pool_bounds.py",
        "tests/validation/test_replay_start_decodes.py"]),
    "staticattn/validation/block_ids.py": (2, ["tests/validation/test_pool_bounds.py",
                                               "tests/validation/test_write_blocks_types.py"]),
    "staticattn/validation/host_arrays.py": (3, ["tests/validation/test_validate.py",
                                                 "tests/validation/test_replay_fast_path.py"]),
    "staticattn/builders/attention_utils/chunking.py": (
        2, ["tests/builders/attention_utils/test_chunking.py"]),
    "staticattn/graphs/dispatch.py": (3, ["tests/validation/test_input_edges.py",
                                          "tests/graphs/test_graph_manager.py",
                                          "tests/graphs/test_step_kinds.py"]),
    "staticattn/graphs/runner.py": (3, ["tests/graphs/test_graph_manager.py",
                                        "tests/validation/test_pool_bounds.py",
                                        "tests/validation/test_input_edges.py",
                                        "tests/graphs/test_run_picks.py"]),
    "staticattn/graphs/in_place.py": (2, ["tests/graphs/test_graph_manager.py",
                                          "tests/validation/test_pool_bounds.py"]),
    "staticattn/graphs/sizes.py": (2, ["tests/graphs/test_graph_manager.py",
                                       "tests/graphs/test_graph_options.py",
                                       "tests/graphs/test_run_picks.py"]),
    # The files of issue #46's bug classes (scripts/class_mutants.py).
    "staticattn/validation/replay_start.py": (2, [
        "tests/validation/test_replay_start_decodes.py"]),
    "staticattn/staging/span_block.py": (2, ["tests/staging/test_span_block_rows.py",
                                             "tests/staging/test_image_spans.py"]),
    "staticattn/kernels/dcp/rank_shares.py": (2, ["tests/consumers/test_dcp_shares.py",
                                                  "tests/consumers/test_dcp_shares_interleave.py"]),
    "staticattn/kernels/indexer/short_topk_fill.py": (2, ["tests/kernels/test_short_topk.py",
                                                          "tests/kernels/test_short_topk_wide.py"]),
    "staticattn/kernels/compressed/topk_operand.py": (2, ["tests/kernels/test_short_topk.py",
                                                          "tests/kernels/test_short_topk_wide.py"]),
    "staticattn/checks/extent_probe.py": (2, ["tests/checks/test_checker_extents.py",
                                              "tests/checks/test_checker_extent_names.py"]),
}

#: Drawn mutants known to compute what the original does: ``(file, original line, mutated
#: line)`` (stripped) -> why. They are run, and left out of the score.
_SCREEN = ("a pre-screen: it only decides whether the exact check runs, and the exact check "
           "accepts the edge value")
EQUIVALENT_DRAWS: dict[tuple[str, str, str], str] = {
    ("staticattn/validation/in_place_views.py",
     "if (seq.item(seq.argmax()) > self.max_model_len",
     "if (seq.item(seq.argmax()) >= self.max_model_len"): _SCREEN,
    ("staticattn/validation/in_place_views.py",
     "or seq.item(seq.argmin()) < self.next_n):",
     "or seq.item(seq.argmin()) <= self.next_n):"): _SCREEN,
    ("staticattn/validation/in_place_views.py",
     "if (not _min(query_lens.view(np.uint32) <= seq)",
     "if (not _min(query_lens.view(np.uint32) < seq)"): _SCREEN + " (q == L), and gives the "
    "same query lengths",
    ("staticattn/validation/host_arrays.py",
     "and 0 < q.shape[0] == s.shape[0] <= config.max_num_seqs",
     "and 0 < q.shape[0] == s.shape[0] < config.max_num_seqs"): _SCREEN,
    ("staticattn/graphs/dispatch.py",
     "self._by_tokens[kind] = [None] * (cfg.max_num_batched_tokens + 1)",
     "self._by_tokens[kind] = [None] * (cfg.max_num_batched_tokens)"):
        "the list of a cleared kind holds no graph, and every lookup is bounded by its "
        "length: the missing last entry reads as None either way",
    ("staticattn/kernels/swa/swa_rows.py",
     "if tl.program_id(0) * BLOCK_T < decode_rows:",
     "if tl.program_id(0) * BLOCK_T <= decode_rows:"):
        "a program starting at decode_rows has no decode row: every load and store of the "
        "branch is masked by i < decode_rows",
    ("staticattn/staging/span_block.py", "if n > self._staged:", "if n >= self._staged:"):
        "n == _staged assigns the value it already holds",
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


def _baseline(test_sets: list[list[str]], timeout: int) -> None:
    """Run each test set once on the unmutated tree: a set that fails there would "kill"
    every mutant."""
    for tests in test_sets:
        if _run_tests(tests, timeout) != "survived":
            raise SystemExit(f"the unmutated tree fails {' '.join(tests)}: fix it first")


def _apply(path: Path, original: str, mutated: str, tests: list[str], timeout: int) -> str:
    """Write ``mutated`` over the file for one test run, then put ``original`` back."""
    try:
        path.write_text(mutated)
        return _run_tests(tests, timeout)
    finally:
        path.write_text(original)


def _draw(seed: int, timeout: int) -> list[tuple]:
    """The random draw: ``(file, line, original, mutant, verdict, why equivalent or "")``
    per mutant."""
    rng = random.Random(seed)
    results = []
    for rel, (count, tests) in TARGETS.items():
        path = ROOT / rel
        original = path.read_text()
        candidates = _code_lines(path)
        for number in sorted(rng.sample(candidates, min(count, len(candidates)))):
            lines = original.splitlines(keepends=True)
            before = lines[number - 1]
            lines[number - 1] = _mutate(before.rstrip("\n")) + "\n"
            verdict = _apply(path, original, "".join(lines), tests, timeout)
            after = lines[number - 1].strip()
            why = EQUIVALENT_DRAWS.get((rel, before.strip(), after), "")
            results.append((rel, number, before.strip(), after, verdict, why))
            print(f"{verdict:>16}  {rel}:{number}  {before.strip()}  ->  {after}"
                  f"{'  (equivalent)' if why else ''}", flush=True)
    return results


def _classes(names: list[str], timeout: int) -> list[tuple[ClassMutant, str]]:
    """The hand-written mutants of the classes ``names`` (every class when empty)."""
    unknown = set(names) - set(CLASSES)
    if unknown:
        raise SystemExit(f"unknown classes {sorted(unknown)}; known: {sorted(CLASSES)}")
    results = []
    for m in CLASS_MUTANTS:
        if names and m.cls not in names:
            continue
        path = ROOT / m.path
        original = path.read_text()
        if original.count(m.original) != 1:
            raise SystemExit(f"{m.path}: {m.original!r} is not there exactly once")
        verdict = _apply(path, original, original.replace(m.original, m.mutated),
                         list(m.tests), timeout)
        results.append((m, verdict))
        print(f"{verdict:>16}  {m.cls}  {m.path}  {m.original.strip()}  ->  "
              f"{m.mutated.strip()}{'  (equivalent)' if m.equivalent else ''}", flush=True)
    return results


def _score(killed: int, total: int) -> str:
    return f"{killed}/{total} killed ({100 * killed / total:.0f}%)" if total else "none"


def _class_lines(results: list[tuple[ClassMutant, str]]) -> list[str]:
    real = [(m, v) for m, v in results if not m.equivalent]
    killed = sum(v.startswith("killed") for _, v in real)
    lines = [f"Hand-written mutants of issue #46's classes: {_score(killed, len(real))} of "
             f"the non-equivalent, {len(results) - len(real)} equivalent left out",
             "class | killed / non-equivalent | what"]
    for cls, (what, _) in CLASSES.items():
        mine = [v for m, v in real if m.cls == cls]
        if mine or any(m.cls == cls for m, _ in results):
            lines.append(f"{cls} | {sum(v.startswith('killed') for v in mine)}/{len(mine)} "
                         f"| {what}")
    lines.append("verdict | class | file | original -> mutant | killed by")
    for m, v in results:
        note = f" | equivalent: {m.equivalent}" if m.equivalent else ""
        lines.append(f"{v} | {m.cls} | {m.path} | {m.original.strip()} -> "
                     f"{m.mutated.strip()} | {' '.join(m.tests)}{note}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", nargs="*", metavar="NAME",
                        help=f"the hand-written mutants of these classes (all when no name "
                             f"is given): {', '.join(CLASSES)}")
    parser.add_argument("--draw", action="store_true", help="the random draw")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=int, default=240)
    parser.add_argument("--out", default="docs/results/mutation_cpu.txt")
    args = parser.parse_args()
    both = args.classes is None and not args.draw
    start = time.time()
    sets = [list(m.tests) for m in CLASS_MUTANTS
            if both or args.classes is not None and (not args.classes or m.cls in args.classes)]
    sets += [tests for _, tests in TARGETS.values()] if both or args.draw else []
    _baseline([list(t) for t in dict.fromkeys(tuple(t) for t in sets)], args.timeout)
    out = [f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()}-core CPU, Triton interpreted: "
           f"python scripts/mutate.py {' '.join(sys.argv[1:])}".rstrip()]
    if both or args.classes is not None:
        out += [""] + _class_lines(_classes(args.classes or [], args.timeout))
    if both or args.draw:
        results = _draw(args.seed, args.timeout)
        real = [r for r in results if not r[5]]
        killed = sum(r[4].startswith("killed") for r in real)
        out += ["", f"Random one-line mutants, seed {args.seed}: {_score(killed, len(real))} of "
                f"the non-equivalent, {len(results) - len(real)} equivalent left out",
                "verdict | file:line | original -> mutant"]
        out += [f"{v} | {f}:{n} | {a} -> {b}" + (f" | equivalent: {why}" if why else "")
                for f, n, a, b, v, why in results]
    out.insert(1, f"{time.time() - start:.0f} s in all")
    Path(ROOT / args.out).write_text("\n".join(out) + "\n")
    print("\n".join(out[:2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
