"""Everything the README shows runs (``doc_blocks``): its Python blocks in order as one
script -- the "Use it" loop unchanged on a CPU (eagerly) or a GPU (captured) --, its test
block under pytest with the plugin, and every command line of its bash blocks; every name a
block reads is defined or imported on the page."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers.doc_blocks import (
    README,
    blocks,
    check_command,
    check_test_files,
    command_lines,
    run_python_page,
    undefined_names,
)

CUDA = torch.cuda.is_available()
PAGE = blocks(README)
COMMANDS = list(dict.fromkeys(line for b in PAGE if b.lang == "bash"
                              for line in command_lines(b)))


def test_the_readme_blocks_are_found():
    """The extraction sees the blocks a reader sees (a test that finds none cannot fail)."""
    python = [b for b in PAGE if b.lang == "python"]
    assert len(python) >= 2 and sum(b.is_test_file for b in python) == 1
    assert any("gm.launch(k)" in b.text for b in python)
    assert {"./dev.sh demo", "./dev.sh test"} <= set(COMMANDS)
    assert not [b.where for b in PAGE if b.needs - {"cuda"}]


def test_every_name_is_defined_or_imported():
    assert undefined_names(PAGE) == []


def test_a_misspelled_name_fails():
    """The check is live: one misspelled name in the loop is named with its line."""
    broken = [dataclasses.replace(b, text=b.text.replace("gm.begin_step()", "gm_.begin_step()"))
              for b in PAGE]
    missing = undefined_names(broken)
    assert len(missing) == 1 and missing[0].startswith("README.md:")
    assert missing[0].endswith(": gm_")


@pytest.mark.skipif(CUDA, reason="without CUDA only; the GPU run is the gpu-marked twin")
def test_the_python_blocks_run_on_the_cpu():
    assert len(run_python_page(PAGE, cuda=False)) >= 1


@pytest.mark.gpu
def test_the_python_blocks_run_on_the_gpu():
    assert len(run_python_page(PAGE, cuda=True)) >= 1


def test_the_test_block_runs_under_pytest(tmp_path):
    """Passes on a GPU; skips cleanly, saying why, without CUDA."""
    assert check_test_files(PAGE, tmp_path, CUDA) == 1


@pytest.mark.parametrize("line", COMMANDS)
def test_every_command_line(line, capsys):
    check_command(line)
