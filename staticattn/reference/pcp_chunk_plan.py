"""Oracle of one rank's prefill-row KV extents under prefill context parallelism
(``prefill-context-parallel.md`` §3.4-§3.6), plain loops over Python ints.

* PCP only (§3.4): every prefill row is its own sequence; ``cu_seq_lens`` the running sum of
  the rows' (compressed) lengths, a token at ``pos`` of row ``r`` reads ``[ks, ke)`` with
  ``ks = cu[r]``, ``ke = ks + (pos + 1) // ratio``. Rank 0 of the P=2 example: rows of seq
  lens 10, 37, 25, 100 -> ``cu_seq_lens = [0, 10, 47, 72, 172]``.
* PCP + DCP (§3.5): the rows of one request form one region holding the request's whole
  DCP-gathered context, ``D * S_k`` entries (``S_k`` the largest shard); ``deinterleave_idx``
  takes the rank-major all-gather of the shards back to global order.
* FlashMLA-sparse (§3.6): one workspace entry per request; a top-k value (a global position)
  becomes a row of the DCP-gathered workspace.

The plan covers the rank's prefill rows as one chunk: rows are indexed from the first
prefill row, ``row_req_idx`` and ``row_shard_rows`` are those rows' request-state indices and
``dcp_local_seq_lens_upper``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GlobalChunkPlan", "chunk_token_extents", "flashmla_entries",
           "global_chunk_plan", "indexer_prefill_extents", "workspace_rows"]


def indexer_prefill_extents(seq_lens: list[int], start_pos: list[int], row_lens: list[int],
                            ratio: int = 1) -> dict[str, list[int]]:
    """PCP-only indexer rows (§3.4) of prefill rows with these ``seq_lens``, first positions
    and query lengths: ``cu_seq_lens`` (rows + 1), and per query token ``ks``, ``ke``."""
    cu, ks, ke = [0], [], []
    for r, (seq_len, start, n) in enumerate(zip(seq_lens, start_pos, row_lens)):
        for pos in range(start, start + n):
            ks.append(cu[r])
            ke.append(cu[r] + (pos + 1) // ratio)
        cu.append(cu[-1] + seq_len // ratio)
    return {"cu_seq_lens": cu, "ks": ks, "ke": ke}


@dataclass
class GlobalChunkPlan:
    """``build_pcp_global_chunk_plan`` (§3.5): ``cu_seq_lens`` (global, rows + 1),
    ``local_cu_seq_lens``, ``row_start_cu``, ``total``, ``padded_local_total``,
    ``deinterleave_idx`` (``total`` entries) and ``token_to_seq`` (``total`` entries: the
    region's first row)."""

    cu_seq_lens: list[int]
    local_cu_seq_lens: list[int]
    row_start_cu: list[int]
    total: int
    padded_local_total: int
    deinterleave_idx: list[int]
    token_to_seq: list[int]


def global_chunk_plan(row_req_idx: list[int], row_shard_rows: list[int], world: int,
                      interleave: int) -> GlobalChunkPlan:
    """The plan of a chunk's rows: regions are runs of equal ``row_req_idx``."""
    n = len(row_req_idx)
    first = [r == 0 or row_req_idx[r] != row_req_idx[r - 1] for r in range(n)]
    padded = [row_shard_rows[r] if first[r] else 0 for r in range(n)]
    global_cu, local_cu = [0], [0]
    for r in range(n):
        global_cu.append(global_cu[-1] + padded[r] * world)
        local_cu.append(local_cu[-1] + padded[r])
    region_first, row_start = [], []
    for r in range(n):
        if first[r]:
            region_first.append(r)
        row_start.append(global_cu[region_first[-1]])
    row_start.append(global_cu[n])
    local_total = local_cu[n]
    idx, token_to_seq = [], []
    for f in region_first:
        shard = row_shard_rows[f]
        for t in range(world * shard):
            # Entries past the request's length are clamped into its own shard, never read.
            local = min((t // world // interleave) * interleave + t % interleave, shard - 1)
            owner = (t // interleave) % world
            idx.append(owner * local_total + local_cu[f] + local)
            token_to_seq.append(f)
    return GlobalChunkPlan(global_cu, local_cu, row_start, global_cu[n], local_total, idx,
                           token_to_seq)


def chunk_token_extents(plan: GlobalChunkPlan, start_pos: list[int], row_lens: list[int],
                        ratio: int = 1) -> dict[str, list[int]]:
    """Per query token of the chunk's rows: ``ks = row_start_cu[row]`` and
    ``ke = ks + (pos + 1) // ratio`` (global positions, not localised)."""
    ks, ke = [], []
    for r, (start, n) in enumerate(zip(start_pos, row_lens)):
        for pos in range(start, start + n):
            ks.append(plan.row_start_cu[r])
            ke.append(plan.row_start_cu[r] + (pos + 1) // ratio)
    return {"ks": ks, "ke": ke}


def flashmla_entries(row_req_idx: list[int], row_shard_rows: list[int], row_lens: list[int],
                     num_decode_tokens: int) -> dict[str, list[int] | int]:
    """FlashMLA-sparse's prefill entries of one chunk (§3.6): ``workspace_starts`` (one per
    request), ``chunk_tot_seqlen`` and ``request_ids`` (one per token of the rank, -1 for
    the ``num_decode_tokens`` decode tokens in front)."""
    starts, request_ids, total = [], [-1] * num_decode_tokens, 0
    for r, (req, shard, n) in enumerate(zip(row_req_idx, row_shard_rows, row_lens)):
        if r == 0 or req != row_req_idx[r - 1]:
            starts.append(total)
            total += shard
        request_ids += [len(starts) - 1] * n
    return {"workspace_starts": starts, "chunk_tot_seqlen": total, "request_ids": request_ids}


def workspace_rows(topk: list[int], workspace_start: int, chunk_tot_seqlen: int, world: int,
                   interleave: int, block_size: int, table_width: int) -> tuple[list[int], int]:
    """The DCP-gathered workspace rows of one token's top-k values (request-relative global
    positions; the token's entry starts at ``workspace_start``): the valid rows compacted to
    the front, -1 after them, and their count (``topk_length``). A value is invalid when
    negative or past the block table's ``table_width`` blocks."""
    rows = []
    for j in topk:
        owner = (j // interleave) % world
        local = (j // (world * interleave)) * interleave + j % interleave
        if j >= 0 and local // block_size < table_width:
            rows.append(owner * chunk_tot_seqlen + workspace_start + local)
    return rows + [-1] * (len(topk) - len(rows)), len(rows)
