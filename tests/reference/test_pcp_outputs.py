"""The per-step outputs around the PCP layout through the oracle: the §3.3 cache-write rows
and slots (every case of the table), a rank's logits indices and maxima on the §2.4 example,
and §9's de-interleave identity on worked example 2 (I = 1 and 64) and drawn batches."""

from __future__ import annotations

import pytest
from helpers.pcp_batches import fresh_prefills, pcp_cases
from helpers.pcp_views import prefill_meta
from hypothesis import given, settings

from staticattn.arena.pcp_config import PCPConfig
from staticattn.reference import pcp_chunk_plan as plan
from staticattn.reference import pcp_layout as pcp
from staticattn.reference import pcp_outputs as outputs

EXAMPLES = 60


def test_cache_write_table():
    slot = list(range(100, 112))  # P = 2, N = 6: rank 0's segment 100..105, rank 1's 106..111
    gathered = [(p, j) for p in range(2) for j in range(6)]
    assert outputs.cache_write_rows(slot[:6], 1, 2, 6, 2, 2) == ([(1, 0), (1, 1)], [100, 101])
    assert outputs.cache_write_rows(slot, 1, 2, 6, 1, 2) == (gathered, slot)
    assert outputs.cache_write_rows(slot, 1, 6, 6, 2, 2) == ([(1, j) for j in range(6)],
                                                             slot[:6])
    rows, slots = outputs.cache_write_rows(slot, 1, 2, 6, 2, 2)
    assert rows == [(1, 0), (1, 1), (0, 2), (0, 3), (0, 4), (0, 5), (1, 2), (1, 3), (1, 4),
                    (1, 5)]
    assert slots == [100, 101, 102, 103, 104, 105, 108, 109, 110, 111]


def test_rank_bounds_example_1():
    cfg, batch = PCPConfig(pcp_size=2), fresh_prefills()
    lay = pcp.layout(cfg, batch)
    want = {0: ([9, 16, 41, 66], 25, 100), 1: ([9, 19, 44, 69], 25, 75)}
    for rank, (logits, max_q, max_s) in want.items():
        meta = pcp.rank_metadata(cfg, batch, lay, rank)
        got = outputs.rank_bounds(meta["query_start_loc"], meta["seq_lens_upper"])
        assert got == {"logits_indices": logits, "max_query_len": max_q, "max_seq_len": max_s}


def _plan(cfg, batch, rank):
    meta = prefill_meta(cfg, batch, pcp.layout(cfg, batch), rank)
    return plan.global_chunk_plan(meta["req_idx"], meta["shard"], cfg.dcp_size,
                                  cfg.cp_kv_cache_interleave_size), meta


@pytest.mark.parametrize("interleave", [1, 64])
def test_deinterleave_example_2(interleave):
    cfg = PCPConfig(pcp_size=2, dcp_size=2, cp_kv_cache_interleave_size=interleave)
    gplan, _ = _plan(cfg, fresh_prefills(), 0)
    regions = outputs.deinterleaved_positions(gplan, [37, 100], 2, interleave)
    if interleave == 1:
        assert regions == [list(range(37)) + [-1], list(range(100))]
    else:  # A: t = 37..63 clamp to its last row, t = 64..73 read rank 1's empty shard
        assert regions == [list(range(37)) + [36] * 27 + [-1] * 10,
                           list(range(100)) + [-1] * 28]


@settings(max_examples=EXAMPLES)
@given(pcp_cases())
def test_deinterleave_restores_positions(case):
    cfg, batch = case
    for p in range(cfg.pcp_size):
        gplan, meta = _plan(cfg, batch, p)
        lens = meta["region_lens"]
        regions = outputs.deinterleaved_positions(gplan, lens, cfg.dcp_size,
                                                  cfg.cp_kv_cache_interleave_size)
        assert [region[:n] for region, n in zip(regions, lens)] == [list(range(n))
                                                                   for n in lens]
