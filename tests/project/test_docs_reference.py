"""The reference a reader looks things up in: the glossary defines every symbol and layer
type the guides use, the API reference lists the manager's step calls and every name the
README and the guides import from staticattn, and those names import from the top level."""

from __future__ import annotations

import ast
import importlib
import re

import pytest
from helpers.doc_blocks import DOCS, README, ROOT, blocks

import staticattn

GLOSSARY = ROOT / "docs" / "glossary.md"
API = (ROOT / "docs" / "api.rst").read_text()
#: What the glossary must define: the symbols, the layer types, the names of rows and steps.
TERMS = ["W", "K", "mit", "R", "T", "next_n", "MTP", "dsa", "swaonly", "c4a", "c128a", "c1a",
         "c2a", "combined row", "FlashInfer rows", "DSpark draft rows", "bounded replay",
         "replay_start", "DCP", "token bucket", "decode graph", "context bucket", "image span",
         "slot", "uniform decode step", "eager step", "the reference"]


def _defined_terms() -> set[str]:
    """The terms of the glossary's definition lists (a term line, then ``: definition``)."""
    lines = GLOSSARY.read_text().splitlines()
    terms = set()
    for line, nxt in zip(lines, lines[1:]):
        if nxt.startswith(": ") and line.strip():
            terms |= {t.strip("` ") for t in line.split(",")}
    return terms


def test_the_glossary_defines_every_term():
    missing = [t for t in TERMS if t not in _defined_terms()]
    assert not missing, missing
    assert "glossary" in (ROOT / "docs" / "index.rst").read_text()
    # W is the config field sliding_window (the metadata's window_size repeats it).
    assert "config field `sliding_window`" in GLOSSARY.read_text()


def test_the_api_reference_lists_the_step_calls():
    for call in ("run", "begin_step", "launch"):
        assert f".. py:method:: staticattn.graphs.manager.GraphManager.{call}(" in API


def _imported_from_staticattn() -> set[tuple[str, str]]:
    """``(module, name)`` of every ``from staticattn... import name`` in the README's and the
    guides' Python blocks."""
    found = set()
    for page in [README, *DOCS]:
        for block in blocks(page):
            if block.lang != "python":
                continue
            for node in ast.walk(ast.parse(block.text)):
                if isinstance(node, ast.ImportFrom) and node.module.startswith("staticattn"):
                    found |= {(node.module, alias.name) for alias in node.names}
    return found


NAMES = sorted(_imported_from_staticattn())


def test_the_readme_and_guides_import_names():
    assert ("staticattn", "default_builders") in NAMES and len(NAMES) >= 8


@pytest.mark.parametrize("module, name", NAMES, ids=[f"{m}.{n}" for m, n in NAMES])
def test_every_imported_name_is_in_the_api_reference(module, name):
    obj = getattr(importlib.import_module(module), name)
    home = obj.__module__
    documented = (f".. automodule:: {home}\n" in API
                  or re.search(rf"\.\. auto\w+:: [\w.]+\.{name}\n", API))
    assert documented, f"{module}.{name} (defined in {home}) is not in docs/api.rst"


def test_the_top_level_exports_the_errors_and_default_builders():
    import staticattn.errors as errors

    for name in [*errors.__all__, "default_builders", "check_eagerly"]:
        assert name in staticattn.__all__
        assert getattr(staticattn, name) is not None
