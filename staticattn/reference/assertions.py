"""How the reference's ``assert_*`` functions compare: explicit checks that name the field and
its first differing row, and that ``python -O`` keeps (a bare ``assert`` would vanish)."""

from __future__ import annotations

from typing import Any

__all__ = ["ReferenceMismatch", "holds", "same"]


class ReferenceMismatch(AssertionError):
    """A builder's output differs from the reference; the message names the field."""


def same(name: str, got: Any, want: Any) -> None:
    """``got == want`` (a tensor or array compared through ``.tolist()``), else
    :class:`ReferenceMismatch` naming ``name`` and the first differing row with both rows."""
    if hasattr(got, "tolist"):
        got = got.tolist()
    if got == want:
        return
    if isinstance(got, list) and isinstance(want, list):
        if len(got) != len(want):
            raise ReferenceMismatch(f"{name}: {len(got)} rows, expected {len(want)}")
        row = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
        raise ReferenceMismatch(f"{name}[{row}]: got {got[row]}, expected {want[row]}")
    raise ReferenceMismatch(f"{name}: got {got!r}, expected {want!r}")


def holds(condition: bool, what: str) -> None:
    """:class:`ReferenceMismatch` saying ``what`` was expected unless ``condition``."""
    if not condition:
        raise ReferenceMismatch(f"expected {what}")
