"""What the prefill-context-parallel split must satisfy on any batch (hypothesis, bounded):
every token computed by exactly one canonical copy, the restore index inverting the split,
the gathered slot mapping equal to the single-rank one, rows of a request adjacent and
partitioning its query, and under DCP every rank charging a prefill the same query tokens."""

from __future__ import annotations

from helpers.pcp_batches import pcp_cases
from hypothesis import given, settings

from staticattn.arena.pcp_config import PCPConfig
from staticattn.reference import pcp_layout as pcp

#: Few examples: each is a handful of plain loops, but the suite runs on two CPU cores.
EXAMPLES = 60


@settings(max_examples=EXAMPLES)
@given(pcp_cases())
def test_every_token_has_one_canonical_copy_and_restores(case):
    cfg, batch = case
    lay = pcp.layout(cfg, batch)
    T = batch.query_start_loc[-1]
    canonical = sorted(g for g, m in zip(lay.padded_gather_idx, lay.write_mask) if m)
    assert canonical == list(range(T))
    assert [lay.padded_gather_idx[k] for k in lay.hidden_restore_idx] == list(range(T))
    assert all(lay.write_mask[k] for k in lay.hidden_restore_idx)
    assert max(lay.num_tokens) == lay.N or T == 0


@settings(max_examples=EXAMPLES)
@given(pcp_cases())
def test_rows_partition_each_query_in_order(case):
    cfg, batch = case
    lay = pcp.layout(cfg, batch)
    covered = {i: [] for i in range(len(batch.query_lens))}
    for rows in lay.rows:
        keys = [(batch.is_prefilling[r.req], r.req, r.offset) for r in rows if r.length]
        assert keys == sorted(keys)  # §2.2, so a request's rows are adjacent
        for r in rows:
            if r.length and not (r.replicated and cfg.dcp_size > 1):
                covered[r.req] += range(r.offset, r.offset + r.length)
    for i, q in enumerate(batch.query_lens):
        copies = sum(r.req == i and r.length > 0 for rows in lay.rows for r in rows)
        if cfg.dcp_size > 1 and copies == cfg.pcp_size and q and not covered[i]:
            continue  # replicated on every rank
        assert sorted(covered[i]) == list(range(q))


@settings(max_examples=EXAMPLES)
@given(pcp_cases())
def test_gathered_slots_equal_the_single_rank_slots(case):
    cfg, batch = case
    lay = pcp.layout(cfg, batch)
    per_dcp_rank = [pcp.gathered_slots(cfg, batch, lay, d) for d in range(cfg.dcp_size)]
    single = PCPConfig(pcp_size=1, block_size=8)
    for i, q in enumerate(batch.query_lens):
        for j in range(q):
            g, pos = batch.query_start_loc[i] + j, batch.num_computed[i] + j
            k = lay.hidden_restore_idx[g]
            written = [s[k] for s in per_dcp_rank if s[k] != pcp.PAD]
            if cfg.dcp_size == 1:
                assert written == [pcp.token_slot(single, batch.block_table[i], pos, 0)]
            else:  # exactly one DCP rank owns the token
                owner = (pos // cfg.cp_kv_cache_interleave_size) % cfg.dcp_size
                assert written == [pcp.token_slot(cfg, batch.block_table[i], pos, owner)]


@settings(max_examples=EXAMPLES)
@given(pcp_cases())
def test_dcp_ranks_charge_a_prefill_alike(case):
    """§2.1: under DCP each rank's chunk plan charges request k ``rows x longest row``, the
    same on every rank."""
    cfg, batch = case
    if cfg.dcp_size == 1:
        return
    lay = pcp.layout(cfg, batch)
    for i, pre in enumerate(batch.is_prefilling):
        if pre and batch.query_lens[i]:
            charges = set()
            for rows in lay.rows:
                mine = [r.length for r in rows if r.req == i and r.length]
                charges.add(len(mine) * max(mine))
            assert len(charges) == 1


@settings(max_examples=EXAMPLES)
@given(pcp_cases())
def test_rank_metadata_follows_the_rows(case):
    cfg, batch = case
    lay = pcp.layout(cfg, batch)
    for p in range(cfg.pcp_size):
        meta = pcp.rank_metadata(cfg, batch, lay, p, cfg.dcp_rank(p))
        assert meta["query_start_loc"][-1] == lay.num_tokens[p]
        assert len(meta["positions"]) == len(meta["token_to_global"]) == lay.N
        # The host bound (rank 0's share of the whole request) bounds every rank's share
        # of every row's prefix.
        assert all(a <= b for a, b in zip(meta["dcp_local_seq_lens"],
                                          meta["dcp_local_seq_lens_upper"]))
        for L in meta["seq_lens"]:
            assert sum(pcp.dcp_local_seq_len(L, cfg.dcp_size, d, cfg.cp_kv_cache_interleave_size)
                       for d in range(cfg.dcp_size)) == L
