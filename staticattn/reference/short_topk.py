"""Oracle of the short-context top-k fill (``vllm-0.33-extras.md`` §4.1, §4.3), plain loops.

The reference engine's kernel writes, for every row when its host condition holds,
``row[j] = j if j < (p + 1) // R else -1`` for ``j < K``. staticattn takes the shortcut per
row, only where the row's own count fits (``(p + 1) // R <= K``); a row that does not fit
keeps its scored top-k. Top-k rows compare as sets: a fitting row's scored top-k is the
same set as its fill.
"""

from __future__ import annotations

__all__ = ["compressed_count", "fill_row", "fits", "topk_row"]


def compressed_count(position: int, ratio: int) -> int:
    """``n_c(p)``: the compressed keys complete at or before position ``p``."""
    return (position + 1) // ratio


def fits(position: int, ratio: int, topk: int) -> bool:
    """Whether the token's compressed context fits the top-k: ``n_c(p) <= K``."""
    return compressed_count(position, ratio) <= topk


def fill_row(position: int, ratio: int, topk: int) -> list[int]:
    """The reference kernel's row: ``j`` for ``j < n_c(p)``, -1 after, ``K`` columns (the
    first ``K`` candidates when ``n_c(p) > K``)."""
    n = compressed_count(position, ratio)
    return [j if j < n else -1 for j in range(topk)]


def topk_row(position: int, ratio: int, topk: int, scored: list[int]) -> list[int]:
    """staticattn's row: the fill where the row fits, else ``scored`` (its scored top-k)."""
    if fits(position, ratio, topk):
        return fill_row(position, ratio, topk)
    return list(scored)
