"""Oracle of the per-step outputs around the prefill-context-parallel layout
(``prefill-context-parallel.md`` §3.1, §3.3, §3.5, §9), plain loops over Python ints.

* **cache writes** (§3.3): which rows a layer's KV write takes and at which slots, from the
  local rows ``x[N]``, the gathered slot mapping ``slot[P N]`` and the rank's decode tokens
  ``nd`` (decode rows first). A row is named ``(rank, local row)``:

  - unexpanded mapping (``len(slot) <= N``, replicated MTP draft decodes): ``x[:nd]`` at
    ``slot[:nd]``;
  - D = 1: ``all_gather(x)`` at ``slot``;
  - D > 1, ``nd == N``: ``x`` at ``slot[:nd]`` (rank 0's segment);
  - D > 1 otherwise: ``x[:nd]`` at ``slot[:nd]``, then ``all_gather(x[nd:])`` at each rank
    ``p``'s ``slot[pN + nd:(p + 1) N]``.

* **rank bounds** (§3.1): ``logits_indices = query_start_loc[1:] - 1`` (never sampled),
  ``max_query_len`` and ``max_seq_len`` (the largest ``seq_lens_upper``), per rank.
* **de-interleave** (§3.5, §9): each DCP rank's packed shards of a chunk, all-gathered
  rank-major and taken at ``deinterleave_idx``, give every region the positions
  ``0 .. L_k - 1`` first.
"""

from __future__ import annotations

from staticattn.reference.pcp_chunk_plan import GlobalChunkPlan

__all__ = ["cache_write_rows", "deinterleaved_positions", "gathered_shards", "rank_bounds"]


def cache_write_rows(slot: list[int], rank: int, num_decode_tokens: int, N: int, world: int,
                     pcp_size: int) -> tuple[list[tuple[int, int]], list[int]]:
    """The rows rank ``rank`` writes (``(source rank, local row)`` each) and their slots."""
    nd = num_decode_tokens
    own = [(rank, j) for j in range(N)]
    if len(slot) <= N:
        return own[:nd], slot[:nd]
    if world == 1:
        return [(p, j) for p in range(pcp_size) for j in range(N)], list(slot)
    if nd == N:
        return own, slot[:nd]
    rows, slots = own[:nd], slot[:nd]
    for p in range(pcp_size):
        rows += [(p, j) for j in range(nd, N)]
        slots += slot[p * N + nd:(p + 1) * N]
    return rows, slots


def rank_bounds(query_start_loc: list[int], seq_lens_upper: list[int]) -> dict[str, object]:
    """A rank's ``logits_indices`` (one per row), ``max_query_len`` and ``max_seq_len``."""
    lens = [b - a for a, b in zip(query_start_loc, query_start_loc[1:])]
    return {"logits_indices": [end - 1 for end in query_start_loc[1:]],
            "max_query_len": max(lens, default=0),
            "max_seq_len": max(seq_lens_upper, default=0)}


def _region_firsts(plan: GlobalChunkPlan) -> list[int]:
    return [r for r in range(len(plan.cu_seq_lens) - 1)
            if plan.cu_seq_lens[r + 1] > plan.cu_seq_lens[r]]


def gathered_shards(plan: GlobalChunkPlan, region_lens: list[int], world: int,
                    interleave: int) -> list[int]:
    """The rank-major all-gather of every DCP rank's packed shards of a chunk, as positions
    (``D * padded_local_total``): rank ``d``'s shard of a region holds, at local index
    ``j``, the position ``(j // I) I D + d I + j % I`` when below the region's length
    ``L_k`` (``region_lens``, regions in order), else -1 (garbage)."""
    local_total = plan.padded_local_total
    gathered = [-1] * (world * local_total)
    for d in range(world):
        for f, length in zip(_region_firsts(plan), region_lens):
            base = d * local_total + plan.local_cu_seq_lens[f]
            for j in range(plan.local_cu_seq_lens[f + 1] - plan.local_cu_seq_lens[f]):
                pos = (j // interleave) * interleave * world + d * interleave + j % interleave
                gathered[base + j] = pos if pos < length else -1
    return gathered


def deinterleaved_positions(plan: GlobalChunkPlan, region_lens: list[int], world: int,
                            interleave: int) -> list[list[int]]:
    """The positions each region holds after ``index_select(all_gather(shards),
    deinterleave_idx)``, one list per region (see :func:`gathered_shards`)."""
    gathered = gathered_shards(plan, region_lens, world, interleave)
    return [[gathered[plan.deinterleave_idx[t]]
             for t in range(plan.cu_seq_lens[f], plan.cu_seq_lens[f + 1])]
            for f in _region_firsts(plan)]
