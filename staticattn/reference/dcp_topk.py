"""Oracle of the exact top-k merge under decode context parallelism (``vllm-0.33-extras.md``
§7.1), plain loops over one row's keys: the packing of each rank's candidates, the merge,
and the single-GPU top-k the merge must equal.

Ownership: key ``x`` (a request-local index, compressed when the keys are) lives on rank
``(x // I) % world``; a rank's local index ``l`` is the number of keys before it that the
rank holds, so ``x = (l // I) * (world * I) + rank * I + l % I``.
"""

from __future__ import annotations

__all__ = ["exact_topk", "global_id", "local_keys", "merge", "pack"]

NEG_INF = float("-inf")


def global_id(local: int, world: int, rank: int, interleave: int) -> int:
    """The key that ``rank``'s local index ``local`` holds."""
    return (local // interleave) * (world * interleave) + rank * interleave + local % interleave


def local_keys(num_keys: int, world: int, rank: int, interleave: int) -> list[int]:
    """The keys of ``[0, num_keys)`` that ``rank`` holds, in local order."""
    return [x for x in range(num_keys) if (x // interleave) % world == rank]


def pack(local_topk: list[int], logits_row: list[float], row_start: int, world: int,
         rank: int, interleave: int) -> list[tuple[float, int]]:
    """One row's candidates on one rank: ``(logits_row[l + row_start], global id)`` per
    local index ``l``, ``(-inf, -1)`` for ``l < 0``."""
    out = []
    for local in local_topk:
        if local < 0:
            out.append((NEG_INF, -1))
        else:
            out.append((logits_row[local + row_start],
                        global_id(local, world, rank, interleave)))
    return out


def merge(candidates: list[tuple[float, int]], topk: int) -> list[int]:
    """The ``topk`` best of one row's candidates (every rank's): by score, ties to the
    smaller id, empty ones never chosen; -1 after the valid ones."""
    real = [(score, x) for score, x in candidates if x >= 0]
    real.sort(key=lambda c: (-c[0], c[1]))
    ids = [x for _, x in real[:topk]]
    return ids + [-1] * (topk - len(ids))


def exact_topk(scores: list[float], topk: int) -> list[int]:
    """The single-GPU top-k of one row's global scores: by score, ties to the smaller key,
    -1 after the row's keys."""
    order = sorted(range(len(scores)), key=lambda x: (-scores[x], x))[:topk]
    return order + [-1] * (topk - len(order))
