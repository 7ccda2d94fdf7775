"""Sphinx configuration: the guides (Markdown, through MyST) and the API reference generated
from the docstrings (numpy style, through napoleon). Built by ``./dev.sh docs`` with warnings
as errors."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

project = "staticattn"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "myst_parser"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
napoleon_numpy_docstring = True
napoleon_google_docstring = False
napoleon_use_ivar = True
autodoc_member_order = "bysource"
autodoc_typehints = "none"
autodoc_default_options = {"members": True, "undoc-members": False, "ignore-module-all": True}
exclude_patterns = ["_build", "results", "spec"]
myst_heading_anchors = 3
# Field names repeat across dataclasses (seq_lens, positions, ...): a bare name in a
# docstring is ambiguous by design, not a broken link.
suppress_warnings = ["myst.xref_missing", "ref.python"]
html_theme = "alabaster"
