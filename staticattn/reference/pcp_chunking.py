"""Oracle of the prefill chunking under prefill context parallelism
(``prefill-context-parallel.md`` §3.5, §3.6), plain loops over Python ints.

One greedy serves every splitter. Items (rows, or requests) come in order, each with an
*extent* (KV entries it adds to the chunk's workspace) and a *charge* (query tokens it adds to
the logits): a chunk takes items while ``ΣN <= workspace`` and ``ΣM * ΣN <= max_logits_elems``;
an item that does not fit even alone is taken alone; each chunk is then cut on the query axis
into slices of ``max(1, max_logits_elems // ΣN)`` charged tokens (``max(1, ΣM)`` when
``ΣN = 0``). A chunk charged 0 query tokens gives no slice.

* **indexer, PCP only** (D = 1): items are the prefill rows, extent ``seq_len // ratio``,
  charge the row's query length;
* **indexer, PCP + DCP**: items are the requests of the prefill rows, extent ``D * S_k``,
  charge ``rows_k * longest row`` -- equal on every rank, so every rank cuts the same chunks
  and issues the same collectives; the request slices are widened back to row slices. The
  query slice then counts charged tokens: on a rank holding fewer, the slice is clamped to
  its tokens and may be empty (it is still issued);
* **FlashMLA-sparse, PCP + DCP**: items are the requests, extent ``S_k``, no logits limit
  and no query cut; every ``S_k`` must fit the workspace (vLLM asserts it). Each chunk's
  workspace starts again at 0.

Worked example (P = 2, D = 2, I = 1, q = (37, 100); both ranks): requests A (``S = 19``, 2
rows of at most 10 tokens, charge 20) and B (``S = 50``, charge 50), extents 38 and 100. With
a workspace of 138 and 20 * 38 <= limit < 70 * 138 the greedy closes A's chunk before B; with
``max_logits_elems = 1000`` B alone is cut into slices of 1000 // 100 = 10 charged tokens:
``(2, 4, 0, 10) ... (2, 4, 40, 50)``.
"""

from __future__ import annotations

__all__ = ["flashmla_chunks", "greedy_chunks", "indexer_chunks", "request_items"]


def greedy_chunks(extents: list[int], charges: list[int], workspace: int,
                  max_logits_elems: int | None = None) -> list[tuple[int, int, int, int]]:
    """The chunks of items with these ``extents`` and ``charges``, each ``(first item, end
    item, query start, query end)``; ``max_logits_elems`` None: no logits limit and one
    slice ``[0, ΣM)`` a chunk."""
    chunks, end, n = [], 0, len(extents)
    while end < n:
        start, m, k = end, 0, 0
        while end < n:
            new_m, new_k = m + charges[end], k + extents[end]
            if new_k > workspace or (max_logits_elems is not None
                                     and new_m * new_k > max_logits_elems):
                break
            m, k, end = new_m, new_k, end + 1
        if end == start:  # does not fit alone: taken alone, cut on the query axis below
            m, k, end = charges[end], extents[end], end + 1
        if max_logits_elems is None:
            chunks.append((start, end, 0, m))
            continue
        step = max(1, max_logits_elems // k) if k > 0 else max(1, m)
        for q0 in range(0, m, step):
            chunks.append((start, end, q0, min(q0 + step, m)))
    return chunks


def request_items(row_req_idx: list[int], row_lens: list[int]) -> list[tuple[int, int, int]]:
    """The requests of a run of rows (runs of equal ``row_req_idx``): ``(first row, end row,
    rows * longest row)`` each."""
    items: list[list[int]] = []
    for r, req in enumerate(row_req_idx):
        if r == 0 or req != row_req_idx[r - 1]:
            items.append([r, r, 0])
        items[-1][1] = r + 1
    return [(a, b, (b - a) * max(row_lens[a:b])) for a, b, _ in items]


def indexer_chunks(row_req_idx: list[int], row_lens: list[int], row_extents: list[int],
                   world: int, workspace: int, max_logits_elems: int
                   ) -> list[tuple[int, int, int, int]]:
    """The indexer's prefill chunks of a rank's prefill rows, ``(first row, end row, query
    start, query end)`` each.

    row_extents : per row, ``seq_len // ratio`` (D = 1) or the request's shard ``S_k`` (the
        row's ``dcp_local_seq_lens_upper``, D > 1).
    """
    if world == 1:
        return greedy_chunks(row_extents, row_lens, workspace, max_logits_elems)
    items = request_items(row_req_idx, row_lens)
    chunks = greedy_chunks([world * row_extents[a] for a, _, _ in items],
                           [m for _, _, m in items], workspace, max_logits_elems)
    bounds = [a for a, _, _ in items] + [len(row_req_idx)]
    return [(bounds[a], bounds[b], q0, q1) for a, b, q0, q1 in chunks]


def flashmla_chunks(row_req_idx: list[int], row_shard_rows: list[int], row_lens: list[int],
                    workspace: int) -> dict[str, list]:
    """FlashMLA-sparse's prefill chunks (§3.6) over the requests (entries) of a rank's prefill
    rows: ``chunks`` ``(first entry, end entry)``, ``workspace_starts`` (per entry, from 0 in
    its chunk), ``chunk_tot_seqlen`` and ``token_slices`` (per chunk, the prefill tokens
    ``[first, end)`` of its rows). Raises ``ValueError`` when an entry's shard exceeds the
    ``workspace``."""
    items = request_items(row_req_idx, row_lens)
    shards = [row_shard_rows[a] for a, _, _ in items]
    if any(s > workspace for s in shards):
        raise ValueError(f"a request's shard of {max(shards)} rows exceeds the prefill "
                         f"workspace of {workspace}")
    chunks = [(a, b) for a, b, _, _ in greedy_chunks(shards, [0] * len(shards), workspace)]
    token_start = [0]
    for n in row_lens:
        token_start.append(token_start[-1] + n)
    starts, totals, token_slices = [], [], []
    for a, b in chunks:
        total = 0
        for k in range(a, b):
            starts.append(total)
            total += shards[k]
        totals.append(total)
        token_slices.append((token_start[items[a][0]], token_start[items[b - 1][1]]))
    return {"chunks": chunks, "workspace_starts": starts, "chunk_tot_seqlen": totals,
            "token_slices": token_slices}
