"""The code blocks of the README and the guides as a reader meets them, and how each runs.

A block is a fenced block (```` ```python ````, ```` ```bash ````; a fence without a
language is text: a diagram, a schema). A block that needs a GPU says so where the reader
sees it: its first line is ``# needs: cuda`` (or an HTML comment ``<!-- needs: cuda -->``
stands on the line before its fence).

* Python blocks of one page run in order in one namespace, as one script: a block may use
  what an earlier block of its page defined, and every name it reads is defined or
  imported on the page (checked statically too, so a GPU block is checked on a CPU). A
  block that defines ``test_*`` functions is a test file of the reader's suite: it runs
  under pytest with the staticattn plugin, in a process of its own.
* Bash blocks: every command line is one of :data:`COMMAND_KINDS`; ``python -m staticattn
  ...`` lines (``staticattn``, ``torchrun ... -m staticattn``, ``taskset ...`` prefixes
  included) are parsed with the command line's own parser and run in process with cheap
  flags appended; the torchrun ones are covered by the multi-process tests named there.
"""

from __future__ import annotations

import ast
import builtins
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from helpers.paths import ROOT

README = ROOT / "README.md"
#: Every page of the guides and results (the built HTML excluded).
DOCS = sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)

FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")
NEEDS = re.compile(r"^\s*(?:#|<!--)\s*needs:\s*([\w, -]+?)\s*(?:-->)?\s*$")
#: The covering test of each kind of command line a bash block may hold.
COMMAND_KINDS = {
    "dev.sh": "tests/test_dev_sh.py (demo); CI runs test, installed and docs (.ci/run)",
    "pip install": "./dev.sh installed (the wheel of the clone in a fresh virtualenv, CI)",
    "staticattn": "a command with at most --preset: tests/test_commands_every_preset.py "
                  "runs it (every command on every preset, text and --json); any other is "
                  "run here with cheap flags appended",
    "torchrun": "tests/test_dcp_demo.py, tests/test_dcp_gloo.py and "
                "tests/distributed/test_pcp_demo.py (gloo ranks)",
}
#: Flags appended to a documented command so that it runs at a small cost, per command;
#: the last occurrence of a flag wins (argparse).
CHEAP = {"demo": ["--steps", "2", "--no-progress"], "check": ["--batches", "1",
                                                               "--no-progress"],
         "bench": ["--reps", "3", "--no-progress"]}


@dataclass(frozen=True)
class Block:
    """One fenced block: its page, the line of its fence, language, text, and what it
    needs (``{"cuda"}`` or empty)."""

    page: Path
    line: int
    lang: str
    text: str
    needs: frozenset[str]

    @property
    def where(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page}:{self.line}"

    @property
    def is_test_file(self) -> bool:
        """A block of the reader's test suite: it defines ``test_*`` functions."""
        return bool(re.search(r"^def test_\w+\(", self.text, re.M))


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, in order."""
    lines = page.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2), i
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        needs = set()
        for marker in ([lines[start - 1]] if start else []) + body[:1]:
            found = NEEDS.match(marker)
            if found:
                needs |= {w.strip() for w in found.group(1).split(",")}
        out.append(Block(page, start + 1, lang, "\n".join(body) + "\n", frozenset(needs)))
    return out


def undefined_names(page_blocks: list[Block]) -> list[str]:
    """``"where: name"`` for every name a Python block reads that neither the block nor an
    earlier block of its page defines or imports (nor Python's builtins)."""
    bound: set[str] = set(dir(builtins)) | {"__name__", "__file__"}
    missing = []
    for block in page_blocks:
        if block.lang != "python":
            continue
        tree = ast.parse(block.text, block.where)
        bound |= _bound_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) \
                    and node.id not in bound:
                missing.append(f"{block.where}: {node.id}")
    return missing


def _bound_names(tree: ast.AST) -> set[str]:
    """Every name a block binds anywhere (assignments, imports, definitions, arguments,
    loop and comprehension targets, ``as`` names)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def run_python_page(page_blocks: list[Block], cuda: bool) -> list[str]:
    """Run the page's Python blocks in order in one namespace (those that need CUDA only
    where it is, test files apart); the blocks run, by ``where``."""
    namespace: dict = {"__name__": "__doc_page__"}
    ran = []
    for block in page_blocks:
        if block.lang != "python" or block.is_test_file or ("cuda" in block.needs and not cuda):
            continue
        exec(compile(block.text, block.where, "exec"), namespace)
        ran.append(block.where)
    return ran


def run_test_file(block: Block, folder: Path) -> str:
    """Run the block as a test file of the reader's suite, by pytest with the staticattn
    plugin (``-rs``: skip reasons in the summary); its output. A failure is an
    AssertionError with that output."""
    path = folder / f"test_{block.page.stem.lower()}_{block.line}.py"
    path.write_text(block.text)
    # The plugin named, others not loaded: the same run whether staticattn is installed or not.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           "-p", "staticattn.checks.pytest_plugin", str(path)], cwd=folder,
                          capture_output=True, text=True, timeout=600, env=env)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"{block.where}:\n{out}"
    return out


def command_lines(block: Block) -> list[str]:
    """The command lines of a bash block: comments dropped, continuations joined."""
    text = re.sub(r"\\\n\s*", " ", block.text)
    out = []
    for line in text.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        if line:
            out.append(line)
    return out


def command_kind(line: str) -> tuple[str, list[str]]:
    """``(kind, argv)``: the kind of a command line (a key of :data:`COMMAND_KINDS`, or
    ``"unknown"``) and, for staticattn and torchrun lines, the staticattn arguments."""
    words = shlex.split(line)
    if words[0] == "taskset":  # taskset -c CPUS COMMAND...
        words = words[3:]
    if words[0] == "./dev.sh":
        return "dev.sh", words[1:]
    if words[:2] == ["pip", "install"]:
        return "pip install", words[2:]
    if words[0] == "torchrun" and "staticattn" in words:
        return "torchrun", words[words.index("staticattn") + 1:]
    if words[:3] == ["python", "-m", "staticattn"]:
        return "staticattn", words[3:]
    if words[0] == "staticattn":
        return "staticattn", words[1:]
    return "unknown", words


def dev_sh_commands() -> set[str]:
    """The commands ``dev.sh`` takes: the labels of its ``case``."""
    text = (ROOT / "dev.sh").read_text()
    return set(re.findall(r"^  ([\w-]+)\)", text, re.M))


def check_test_files(page_blocks: list[Block], folder: Path, cuda: bool) -> int:
    """Run the page's test-file blocks: each passes on a GPU, and skips cleanly without CUDA
    (the plugin's graph checks need one); how many ran."""
    files = [b for b in page_blocks if b.is_test_file]
    for block in files:
        out = run_test_file(block, folder)
        if cuda:
            assert re.search(r"\b\d+ passed", out) and "skipped" not in out, out
        else:
            assert "needs a CUDA device" in out, out
    return len(files)


def check_command(line: str) -> str:
    """Check one command line of a bash block (see the module); its kind."""
    import torch

    from staticattn.__main__ import main
    from staticattn.cli import ExitCode, build_parser, validate

    kind, argv = command_kind(line)
    assert kind in COMMAND_KINDS, f"no test covers this command: {line!r}"
    if kind == "dev.sh":
        assert argv[0] in dev_sh_commands(), line
    elif kind == "pip install":
        for extra in re.findall(r"\[([\w,-]+)\]", " ".join(argv)):
            assert set(extra.split(",")) <= _extras(), line
    elif kind == "torchrun":
        args = build_parser().parse_args(argv)  # a bad flag or preset exits 2 here
        validate(args, torch.cuda.is_available())
        # The multi-process runs: decode or prefill context parallelism.
        assert args.dcp or args.pcp, line
    elif _in_the_matrix(argv):
        args = build_parser().parse_args(argv)
        validate(args, torch.cuda.is_available())
        return "staticattn (the command matrix)"
    else:
        rc = main(argv + CHEAP[argv[0]])
        skipped = argv[0] == "bench" and not torch.cuda.is_available()
        assert rc == (ExitCode.SKIPPED if skipped else ExitCode.PASS), (line, rc)
    return kind


def _in_the_matrix(argv: list[str]) -> bool:
    """A command with at most ``--preset``: tests/test_commands_every_preset.py runs it, on
    every preset, in text and ``--json``."""
    return len(argv) == 1 or (len(argv) == 3 and argv[1] == "--preset")


def _extras() -> set[str]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        from pip._vendor import tomli as tomllib

    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
               ["optional-dependencies"])
