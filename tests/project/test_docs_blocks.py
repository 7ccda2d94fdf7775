"""Everything the guides show runs (``doc_blocks``): every page under ``docs/``, its Python
blocks in order as one script (blocks marked ``# needs: cuda`` only on a GPU, under the
``gpu`` marker), its test blocks under pytest with the plugin, every command line of its
bash blocks; every name a block reads is defined or imported on the page."""

from __future__ import annotations

import pytest
import torch
from helpers.doc_blocks import (
    DOCS,
    ROOT,
    blocks,
    check_command,
    check_test_files,
    command_lines,
    run_python_page,
    undefined_names,
)

CUDA = torch.cuda.is_available()
PAGES = {str(p.relative_to(ROOT)): blocks(p) for p in DOCS}
WITH_PYTHON = [name for name, page in PAGES.items() if any(b.lang == "python" for b in page)]
WITH_TESTS = [name for name, page in PAGES.items() if any(b.is_test_file for b in page)]
COMMANDS = list(dict.fromkeys(line for page in PAGES.values() for b in page
                              if b.lang == "bash" for line in command_lines(b)))


def test_the_guides_blocks_are_found():
    assert {"docs/embedding.md", "docs/checks.md"} <= set(WITH_PYTHON)
    assert WITH_TESTS == ["docs/checks.md"]
    assert sum(b.lang == "python" for b in PAGES["docs/embedding.md"]) >= 6
    assert any(line.startswith("torchrun ") for line in COMMANDS)
    # Every fence says its language, or is text (the diagrams, the JSON schema); every
    # marker is one the tests read.
    for page in PAGES.values():
        for b in page:
            assert b.lang in ("", "python", "bash"), b.where
            assert b.needs <= {"cuda"}, b.where


def test_markers_are_read_in_both_forms(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- needs: cuda -->\n```python\nx = 1\n```\n\n```python\n"
                    "# needs: cuda\ny = x\n```\n\n```python\nz = y\n```\n")
    assert [b.needs for b in blocks(page)] == [{"cuda"}, {"cuda"}, set()]
    # A CPU run skips the marked blocks; the unmarked one then misses their names.
    with pytest.raises(NameError, match="'y' is not defined"):
        run_python_page(blocks(page), cuda=False)


@pytest.mark.parametrize("name", sorted(PAGES))
def test_every_name_is_defined_or_imported(name):
    assert undefined_names(PAGES[name]) == []


@pytest.mark.skipif(CUDA, reason="without CUDA only; the GPU run is the gpu-marked twin")
@pytest.mark.parametrize("name", WITH_PYTHON)
def test_the_python_blocks_run_on_the_cpu(name):
    run_python_page(PAGES[name], cuda=False)


@pytest.mark.gpu
@pytest.mark.parametrize("name", WITH_PYTHON)
def test_the_python_blocks_run_on_the_gpu(name):
    run_python_page(PAGES[name], cuda=True)


@pytest.mark.parametrize("name", WITH_TESTS)
def test_the_test_blocks_run_under_pytest(name, tmp_path):
    assert check_test_files(PAGES[name], tmp_path, CUDA) >= 1


@pytest.mark.parametrize("line", COMMANDS)
def test_every_command_line(line, capsys):
    check_command(line)
