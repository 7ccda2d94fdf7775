"""Sphinx configuration: the guides (Markdown, through MyST) and the API reference generated
from the docstrings (numpy style, through napoleon). Built by ``./dev.sh docs`` with warnings
as errors (CI builds it)."""

import os
import re
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
myst_enable_extensions = ["deflist"]  # the glossary's terms
# Field names repeat across dataclasses (seq_lens, positions, ...): a bare name in a
# docstring is ambiguous by design, not a broken link.
suppress_warnings = ["myst.xref_missing", "ref.python"]
html_theme = "alabaster"

#: Numpy sections whose body is a list of fields (``name : type`` lines).
FIELD_SECTIONS = {"Parameters", "Other Parameters", "Attributes", "Returns", "Yields",
                  "Raises", "Warns", "Receives"}
#: A field's first line: ``name``, ``name1, name2``, ``*args``, each with ``: type`` or not.
FIELD = re.compile(r"^\**\w[\w, *]*( : .*)?$")
UNDERLINE = re.compile(r"^-{3,}$")


def end_fields_where_prose_starts(app, what, name, obj, options, lines):
    """Read a numpy docstring as its reader does, before napoleon does.

    Napoleon takes every line up to the next section header as more fields, so a paragraph
    written flush left after a section of fields (how ``GraphManager`` describes ``run``,
    ``begin_step`` and ``launch``) would be rendered as a garbled parameter list. Such a
    paragraph -- after a blank line, not of the form ``name : type`` -- starts a Notes
    section instead; a field's type wrapped onto the next line (flush left, or inside an
    inline literal left open) is joined to it."""
    out, in_fields = [], False
    for i, line in enumerate(lines):
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        prev = out[-1] if out else ""
        if line.strip() and UNDERLINE.match(nxt.strip()):
            in_fields = line.strip() in FIELD_SECTIONS
        elif in_fields and prev[:1].strip() and prev.count("``") % 2:
            out[-1] = f"{prev.rstrip()} {line.strip()}"
            continue
        elif in_fields and line and not line[0].isspace() and not UNDERLINE.match(line):
            if not prev.strip():
                if not FIELD.match(line):
                    out += ["Notes", "-----"]
                    in_fields = False
            elif not prev[0].isspace() and not FIELD.match(line):
                out[-1] = f"{prev.rstrip()} {line.strip()}"
                continue
        out.append(line)
    lines[:] = out


def setup(app):
    # Before napoleon (priority 500), which turns the sections into fields.
    app.connect("autodoc-process-docstring", end_fields_where_prose_starts, priority=400)
