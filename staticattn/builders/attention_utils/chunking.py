"""Prefill chunk planning: greedy workspace chunks (spec §3.3) and the indexer's chunks
bounded by both the gather workspace and the logits budget (spec §4.6).

Pure host functions over host lengths; no device reads.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from staticattn.errors import CapacityError

__all__ = ["split_prefill_chunks", "split_indexer_prefill_chunks"]


def split_prefill_chunks(
    seq_lens_cpu: Sequence[int] | np.ndarray, workspace_size: int, request_offset: int = 0
) -> list[tuple[int, int]]:
    """Greedy request chunks whose summed sequence lengths fit ``workspace_size``.

    Parameters
    ----------
    seq_lens_cpu : int array ``(num_prefills,)``
        Host sequence lengths of the prefill requests.
    workspace_size : int
        Tokens one chunk may hold.
    request_offset : int
        Added to every request index (the number of decodes before the prefills).

    Returns
    -------
    list of (start, end)
        Half-open request ranges, offset by ``request_offset``.

    Raises
    ------
    CapacityError
        If a single request is longer than the workspace.

    Examples
    --------
    >>> split_prefill_chunks([2, 3, 4, 2], 5)
    [(0, 2), (2, 3), (3, 4)]
    """
    lens = [int(x) for x in np.asarray(seq_lens_cpu).reshape(-1)]
    for i, s in enumerate(lens):
        if s > workspace_size:
            raise CapacityError(
                f"prefill request {i + request_offset} has {s} tokens, more than the "
                f"workspace of {workspace_size}"
            )
    chunks: list[tuple[int, int]] = []
    i, n = 0, len(lens)
    while i < n:
        start, total = i, 0
        while i < n and total + lens[i] <= workspace_size:
            total += lens[i]
            i += 1
        chunks.append((start + request_offset, i + request_offset))
    return chunks


def split_indexer_prefill_chunks(
    seq_lens_cpu: Sequence[int] | np.ndarray,
    query_lens_cpu: Sequence[int] | np.ndarray,
    workspace_size: int,
    max_logits_bytes: int,
    request_offset: int = 0,
) -> list[tuple[slice, slice]]:
    """Indexer prefill chunks bounded by the gather workspace and the fp32 logits budget.

    Parameters
    ----------
    seq_lens_cpu : int array ``(num_prefills,)``
        Compressed key counts ``N_b`` of the prefill requests.
    query_lens_cpu : int array ``(num_prefills,)``
        Query lengths ``M_b``.
    workspace_size : int
        Keys one chunk may gather (``sum N <= workspace_size``).
    max_logits_bytes : int
        Budget of one chunk's fp32 logits: ``(sum M) * (sum N) * 4 <= max_logits_bytes``.
    request_offset : int
        Added to every request index.

    Returns
    -------
    list of (req_slice, query_slice)
        Request ranges (offset) and, within each, query sub-ranges relative to the chunk's
        first query token. A single request over the budget is taken alone and its queries
        are cut into sub-chunks of ``max(1, E // N)`` tokens (``E = max_logits_bytes // 4``).

    Examples
    --------
    ``N = [10,10,10]``, ``M = [5,5,5]``, workspace 100, 1000 bytes ->
    ``[(0:2, 0:10), (2:3, 0:5)]``. ``N = [100,40,3000]``, ``M = [100,40,300]``, workspace
    4000, 800,000 bytes, offset 2 -> ``(2:4, 0:140)``, then ``(4:5, 0:66)``, ``(4:5, 66:132)``,
    ``(4:5, 132:198)``, ``(4:5, 198:264)``, ``(4:5, 264:300)``.
    """
    seq = [int(x) for x in np.asarray(seq_lens_cpu).reshape(-1)]
    qry = [int(x) for x in np.asarray(query_lens_cpu).reshape(-1)]
    budget = max_logits_bytes // 4
    chunks: list[tuple[slice, slice]] = []
    n, end = len(seq), 0
    while end < n:
        start, m, keys = end, 0, 0
        while end < n:
            new_m, new_keys = m + qry[end], keys + seq[end]
            if new_keys > workspace_size or new_m * new_keys > budget:
                break
            m, keys = new_m, new_keys
            end += 1
        if end == start:
            m, keys = qry[end], seq[end]
            end += 1
        req = slice(start + request_offset, end + request_offset)
        step = max(1, budget // keys) if keys > 0 else m
        for q0 in range(0, m, max(step, 1)):
            chunks.append((req, slice(q0, q0 + min(step, m - q0))))
    return chunks
