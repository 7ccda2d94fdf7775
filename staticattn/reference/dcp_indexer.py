"""Oracle of one rank's indexer metadata under decode context parallelism, written as plain
loops from the spec's words (vllm-0.33-delta.md §4.1) and nothing of staticattn's kernels.

The spec, restated in tokens: a sequence's tokens are dealt to ``world`` ranks in groups of
``interleave`` (``I``) -- position ``p`` lives on rank ``(p // I) % world``. A compressed
entry ``c`` of ratio ``R`` is the summary of tokens ``[cR, (c + 1) R)`` and lives where its
tokens live (``I`` is a multiple of ``R``, so they agree: the rank of token ``cR``). A rank
stores the entries it owns in order: an entry's local index is the number of entries before
it that the same rank owns; local block ``j`` of the rank's block table holds local indices
``[j S, (j + 1) S)``.

Per token, a length is localised *after* it is expanded per token: the global visible
length ``g`` (entries ``0 .. g - 1``) becomes the number of those entries the rank owns.
"""

from __future__ import annotations

from staticattn.reference import indexer as single
from staticattn.reference import mixed as single_mixed
from staticattn.reference.assertions import holds, same

__all__ = ["assert_matches", "assert_mixed_matches", "indexer_metadata", "local_counter",
           "local_index", "mixed_indexer", "owner_of_entry", "slot_mapping"]


def owner_of_entry(c: int, ratio: int, world: int, interleave: int) -> int:
    """The rank holding compressed entry ``c``: the rank of its first token."""
    return (c * ratio // interleave) % world


def local_counter(ratio: int, world: int, rank: int, interleave: int):
    """``count(g)``: how many of entries ``0 .. g - 1`` the rank holds, by one running table
    shared between the many tokens of a step. Of an entry ``c`` the rank holds, ``count(c)``
    is its local index (the entries before it that the rank holds)."""
    table = [0]

    def count(g: int) -> int:
        while len(table) <= g:
            c = len(table) - 1
            table.append(table[-1] + (owner_of_entry(c, ratio, world, interleave) == rank))
        return table[g]

    return count


def local_index(c: int, ratio: int, world: int, interleave: int) -> int:
    """Entry ``c``'s index among the entries its owner holds."""
    owner = owner_of_entry(c, ratio, world, interleave)
    return local_counter(ratio, world, owner, interleave)(c)


def slot_mapping(config, step, rank: int, num_tokens: int | None = None) -> list[int]:
    """§4.5 per rank: the token completing entry ``c`` writes it only on ``c``'s owner, at
    the slot of its local index in that rank's block table."""
    ratio, world = config.index_compress_ratio, config.dcp_world_size
    interleave, s = config.cp_kv_cache_interleave_size, config.storage_block_size
    qsl, seq_lens = step.query_start_loc, step.padded_seq_lens()
    count = local_counter(ratio, world, rank, interleave)
    out = [-1] * (step.num_tokens_padded if num_tokens is None else num_tokens)
    for b in range(step.num_reqs):
        q = qsl[b + 1] - qsl[b]
        for j in range(q):
            p = seq_lens[b] - q + j
            if (p + 1) % ratio:
                continue
            c = p // ratio
            if owner_of_entry(c, ratio, world, interleave) != rank:
                continue
            li = count(c)
            out[qsl[b] + j] = int(step.block_table[b][li // s]) * s + li % s
    return out


def indexer_metadata(config, step, rank: int, *, graph: bool = False, legacy: bool = False):
    """Every field of rank ``rank``'s builder output for a staged step: the single-GPU
    oracle's global values, then localised per token."""
    ratio, world = config.index_compress_ratio, config.dcp_world_size
    interleave = config.cp_kv_cache_interleave_size
    glob = single.indexer_metadata(config, step, graph=graph, legacy=legacy)
    count = local_counter(ratio, world, rank, interleave)
    expected = dict(glob, slot_mapping=slot_mapping(config, step, rank))
    if glob["decode"] is not None:
        decode = dict(glob["decode"])
        decode["global_seq_lens"] = decode["seq_lens"]
        decode["seq_lens"] = [[count(g) for g in row] for row in decode["seq_lens"]]
        decode["schedule"] = single.mqa_schedule(decode["seq_lens"], config.num_sms, legacy)
        expected["decode"] = decode
    if glob["prefill"]:
        expected["prefill"] = [_local_chunk(chunk, step, ratio, world, rank, interleave)
                               for chunk in glob["prefill"]]
    return expected


def _local_chunk(chunk, step, ratio, world, rank, interleave):
    """§4.7 plus vLLM 0.33's local row bounds: the same chunk (planned from the global
    lengths), with local key prefix sums, local per-token bounds and the local totals."""
    qsl, seq_lens = step.query_start_loc, step.padded_seq_lens()
    start, end = chunk["requests"]
    per_rank = []
    for r in range(world):
        count = local_counter(ratio, world, r, interleave)
        per_rank.append([count(seq_lens[b] // ratio) for b in range(start, end)])
    count = local_counter(ratio, world, rank, interleave)
    cu = [0]
    for k in per_rank[rank]:
        cu.append(cu[-1] + k)
    ks, ke = [], []
    for r, b in enumerate(range(start, end)):
        q = qsl[b + 1] - qsl[b]
        for o in range(q):
            t = qsl[b] + o
            if chunk["token_start"] <= t < chunk["token_end"]:
                ks.append(cu[r])
                ke.append(cu[r] + count((seq_lens[b] - q + 1 + o) // ratio))
    return dict(chunk, cu_seqlen_ks=ks, cu_seqlen_ke=ke, local_cu_seq_lens=cu,
                local_total_seq_lens=sum(per_rank[rank]),
                max_local_total_seq_lens=max(sum(keys) for keys in per_rank))


def assert_matches(meta, expected, step, arena) -> None:
    """The single-GPU checks on the localised expectation, plus the DCP-only fields."""
    single.assert_matches(meta, expected, step, arena)
    if expected["decode"] is not None:
        same("decode.global_seq_lens", meta.decode.global_seq_lens,
             expected["decode"]["global_seq_lens"])
        holds(meta.decode.global_seq_lens.is_contiguous(), "decode.global_seq_lens contiguous")
    for chunk, want in zip(meta.prefill.chunks if meta.prefill else (),
                           expected["prefill"] or ()):
        for name in ("local_cu_seq_lens", "local_total_seq_lens", "max_local_total_seq_lens"):
            same(f"prefill chunk {name}", getattr(chunk, name), want[name])


def mixed_indexer(config, step, rank: int, num_reqs: int, num_tokens: int, chunk_rows: int):
    """Every output of rank ``rank``'s ``build_mixed`` for a bucket: the single-GPU mixed
    oracle's global values, localised; chunk rows gain the local and the largest local key
    counts of their range (columns 6 and 7)."""
    ratio, world = config.index_compress_ratio, config.dcp_world_size
    interleave = config.cp_kv_cache_interleave_size
    exp = single_mixed.indexer(config, step, num_reqs, num_tokens, chunk_rows)
    count = local_counter(ratio, world, rank, interleave)
    exp["slot_mapping"] = slot_mapping(config, step, rank, num_tokens)
    exp["global_seq_lens"] = exp["seq_lens"]
    exp["seq_lens"] = [[count(g) for g in row] for row in exp["seq_lens"]]
    exp["schedule"] = single.mqa_schedule(exp["seq_lens"], config.num_sms, legacy=False)
    seq = step.padded_seq_lens() + [0] * (num_reqs - step.num_reqs_padded)
    keys = [[local_counter(ratio, world, r, interleave)(s // ratio) for s in seq]
            for r in range(world)]
    k, nt, d, td = single_mixed.counts(config, step)
    query_lens = [int(x) for x in step.query_lens]
    plan = single.prefill_chunk_plan([s // ratio for s in seq[d:k]], query_lens[d:],
                                     config.max_prefill_workspace, config.max_logits_bytes, d)
    local_cu, local_start = [0] * (2 * num_reqs), [0] * num_reqs
    range_of = {}
    for (s, e), _ in plan:
        running = 0
        for j, b in enumerate(range(s, e)):
            local_start[b] = running
            local_cu[2 * s + j] = running
            running += keys[rank][b]
            range_of[b] = (s, e)
        local_cu[s + e] = running
    for row in exp["chunk_bounds"]:
        s, e = row[0], row[1]
        if e > 0:
            row[6] = sum(keys[rank][s:e])
            row[7] = max(sum(keys[r][s:e]) for r in range(world))
    qsl = step.query_start_loc
    for b in range(d, k):
        q = qsl[b + 1] - qsl[b]
        for o in range(q):
            exp["cu_seqlen_ks"][qsl[b] + o] = local_start[b]
            exp["cu_seqlen_ke"][qsl[b] + o] = local_start[b] + count((seq[b] - q + 1 + o) // ratio)
    exp.update(local_cu_seq_lens=local_cu, local_req_key_start=local_start)
    return exp


def assert_mixed_matches(meta, exp, config, step) -> None:
    """A rank's mixed indexer build equals :func:`mixed_indexer`'s ``exp`` everywhere in the
    bucket's views, the global lengths and the local key counts included."""
    single_mixed.assert_indexer_matches(meta, exp, config, step)
    same("decode.global_seq_lens", meta.decode.global_seq_lens, exp["global_seq_lens"])
    plan = meta.prefill.plan
    same("plan.local_cu_seq_lens", plan.local_cu_seq_lens, exp["local_cu_seq_lens"])
    same("plan.local_req_key_start", plan.local_req_key_start, exp["local_req_key_start"])
