"""The device builds of prefill context parallelism against the oracle, field by field: every
rank's rows, metadata and gathered layout, the gathered slot mappings, the prefill KV extents
(PCP only and the PCP+DCP global plan with the FlashMLA entries) and V4.1's ring links and
compressed slots; on the spec's examples and on drawn batches. Past the counts every view
holds its pad value."""

from __future__ import annotations

import pytest
import torch
from helpers.pcp_batches import fresh_prefills, pcp_cases, staged
from helpers.pcp_views import MAX_TOKENS, device_extents, device_fields, device_rows
from hypothesis import given, settings

from staticattn.arena.pcp_config import PCPConfig
from staticattn.builders.pcp.kv_plan import PrefillExtents
from staticattn.builders.pcp.rank_fields import (
    compressed_gathered_slots,
    gathered_slots,
)
from staticattn.builders.pcp.ring_link import build_ring_links
from staticattn.reference import pcp_chunk_plan as plan
from staticattn.reference import pcp_layout as pcp
from staticattn.reference import pcp_ring as ring

EXAMPLES = 40
#: Workspace entries of the PCP+DCP plan's views.
WORKSPACE = 1024


def _padded(values: list, size: int, pad=0) -> list:
    return list(values) + [pad] * (size - len(values))


def check_layout(cfg: PCPConfig, batch: pcp.GlobalBatch, backend: str = "torch") -> None:
    lay = pcp.layout(cfg, batch)
    inputs = staged(batch, cfg.max_num_seqs)
    rows = device_rows(cfg, inputs, lay.N, backend)
    R, T = cfg.max_rows, batch.query_start_loc[-1]
    assert rows.num_tokens.tolist() == lay.num_tokens
    assert rows.token_to_global.flatten().tolist() == lay.padded_gather_idx
    assert rows.write_mask.flatten().tolist() == lay.write_mask
    assert rows.hidden_restore_idx.tolist() == _padded(lay.hidden_restore_idx, MAX_TOKENS)
    for p, want in enumerate(lay.rows):
        got = list(zip(rows.row_req[p].tolist(), rows.row_offset[p].tolist(),
                       rows.row_len[p].tolist(), rows.row_replicated[p].tolist()))
        assert got == _padded([(r.req, r.offset, r.length, r.replicated) for r in want], R,
                              (0, 0, 0, False))
        assert rows.num_rows[p] == len(want)
        assert rows.num_decode_rows[p] == sum(not batch.is_prefilling[r.req] for r in want
                                              if r.length)
        meta = pcp.rank_metadata(cfg, batch, lay, p, cfg.dcp_rank(p))
        assert rows.query_start_loc[p].tolist() == _padded(meta["query_start_loc"], R + 1,
                                                           lay.num_tokens[p])
        assert rows.positions[p].tolist() == meta["positions"]
        assert rows.token_to_global[p].tolist() == meta["token_to_global"]
        fields = device_fields(cfg, rows, inputs, p)
        for name in ("start_pos", "seq_lens", "seq_lens_upper", "req_idx", "is_prefilling",
                     "global_query_lens", "global_seq_lens_upper", "dcp_local_seq_lens",
                     "dcp_local_seq_lens_upper"):
            want_field = meta[name]
            assert getattr(fields, name).tolist() == _padded(want_field, R, type(
                want_field[0])(0)), name
    for d in range(cfg.dcp_size):
        slots = torch.empty(cfg.pcp_size * lay.N, dtype=torch.int64)
        gathered_slots(cfg, rows, inputs["block_table"], d, slots)
        assert slots.tolist() == pcp.gathered_slots(cfg, batch, lay, d)
    assert T <= MAX_TOKENS


def check_extents(cfg: PCPConfig, batch: pcp.GlobalBatch, ratio: int = 1,
                  backend: str = "torch") -> None:
    lay = pcp.layout(cfg, batch)
    inputs = staged(batch, cfg.max_num_seqs)
    rows = device_rows(cfg, inputs, lay.N)
    R, N = cfg.max_rows, lay.N
    for p in range(cfg.pcp_size):
        meta = pcp.rank_metadata(cfg, batch, lay, p, cfg.dcp_rank(p))
        out = device_extents(cfg, rows, device_fields(cfg, rows, inputs, p), p,
                             PrefillExtents.allocate(cfg, N, WORKSPACE), ratio, backend)
        qsl = meta["query_start_loc"]
        lens = [b - a for a, b in zip(qsl, qsl[1:])]
        pre = [r for r, row in enumerate(lay.rows[p]) if row.length and
               batch.is_prefilling[row.req]]
        nd_tokens = qsl[pre[0]] if pre else 0
        pick = lambda name, meta=meta, pre=pre: [meta[name][r] for r in pre]
        pre_lens = [lens[r] for r in pre]
        if cfg.dcp_size == 1:
            want = plan.indexer_prefill_extents(pick("seq_lens"), pick("start_pos"), pre_lens,
                                                ratio)
            cu, ks, ke = want["cu_seq_lens"], want["ks"], want["ke"]
            starts = None
        else:
            gplan = plan.global_chunk_plan(pick("req_idx"), pick("dcp_local_seq_lens_upper"),
                                           cfg.dcp_size, cfg.cp_kv_cache_interleave_size)
            ext = plan.chunk_token_extents(gplan, pick("start_pos"), pre_lens, ratio)
            cu, ks, ke = gplan.cu_seq_lens, ext["ks"], ext["ke"]
            assert out.local_cu_seq_lens.tolist() == _padded(gplan.local_cu_seq_lens, R + 1,
                                                             gplan.padded_local_total)
            assert out.row_start_cu.tolist() == _padded(gplan.row_start_cu, R + 1,
                                                        gplan.total)
            assert out.deinterleave_idx.tolist() == _padded(gplan.deinterleave_idx, WORKSPACE)
            assert out.token_to_seq.tolist() == _padded(gplan.token_to_seq, WORKSPACE)
            starts = plan.flashmla_entries(pick("req_idx"), pick("dcp_local_seq_lens_upper"),
                                           pre_lens, nd_tokens)
        assert out.cu_seq_lens.tolist() == _padded(cu, R + 1, cu[-1])
        assert out.ks.tolist() == _padded(ks, N) and out.ke.tolist() == _padded(ke, N)
        if starts is not None:
            assert out.workspace_starts.tolist() == _padded(starts["workspace_starts"], R)
            assert out.request_ids.tolist() == _padded(starts["request_ids"], N, -1)


def check_ring(cfg: PCPConfig, batch: pcp.GlobalBatch) -> None:
    lay = pcp.layout(cfg, batch)
    inputs = staged(batch, cfg.max_num_seqs)
    rows = device_rows(cfg, inputs, lay.N)
    P, R = cfg.pcp_size, cfg.max_rows
    ring_block = [5 + 4 * i for i in range(len(batch.query_lens))]
    prev = torch.empty(P, R, dtype=torch.int32)
    write = torch.empty(P * R, dtype=torch.int64)
    build_ring_links(rows, inputs["num_computed"],
                     torch.tensor(_padded(ring_block, cfg.max_num_seqs), dtype=torch.int32),
                     prev, write)
    want = ring.ring_links(batch, lay, ring_block, R)
    assert write.tolist() == want["ring_write_slots"]
    assert prev.tolist() == [_padded(w, R, -1) for w in want["prev_row_indices"]]
    slots = torch.empty(P * lay.N, dtype=torch.int64)
    # Ratio 2: a compressed block holds half a KV block's tokens' states (bs_c = bs / 2).
    bs_c = cfg.block_size // 2
    compressed_gathered_slots(rows, inputs["block_table"], bs_c, 2, slots)
    assert slots.tolist() == ring.compressed_gathered_slots(batch, lay, batch.block_table, bs_c,
                                                            2)


@pytest.mark.parametrize(("pcp_size", "dcp_size", "interleave"),
                         [(2, 1, 1), (4, 1, 1), (2, 2, 1), (2, 2, 64), (4, 4, 8)])
def test_spec_example(pcp_size, dcp_size, interleave):
    cfg = PCPConfig(pcp_size=pcp_size, dcp_size=dcp_size, max_num_seqs=4,
                    cp_kv_cache_interleave_size=interleave)
    check_layout(cfg, fresh_prefills())
    check_extents(cfg, fresh_prefills())
    if dcp_size == 1:
        check_ring(cfg, fresh_prefills())


def test_ring_example_4():
    """§4.2's worked example, through the device build (R = 2 * max_num_seqs = 8)."""
    check_ring(PCPConfig(pcp_size=4, max_num_seqs=4), fresh_prefills())


@settings(max_examples=EXAMPLES)
@given(pcp_cases())
def test_drawn_layouts(case):
    check_layout(*case)


@settings(max_examples=EXAMPLES)
@given(pcp_cases())
def test_drawn_extents(case):
    check_extents(*case)


@settings(max_examples=EXAMPLES)
@given(pcp_cases(dcp=False))
def test_drawn_ring_links(case):
    check_ring(*case)


#: §9's edge cases: a lone decode (the other rank gets the placeholder), a short prefill
#: (split 2/2/1 under PCP only, replicated under DCP), MTP decode rows of 3 tokens with a
#: continued prefill behind them, and an empty step.
EDGES = {
    "lone decode": pcp.GlobalBatch([1], [40], [False], [0], [[1, 2, 3, 4, 5, 6]]),
    "short prefill": pcp.GlobalBatch([5], [0], [True], [2], [[9]]),
    "mtp and continued prefill": pcp.GlobalBatch(
        [3, 3, 19, 3], [17, 8, 33, 0], [False, False, True, False], [4, 1, 6, 2],
        [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10, 11, 12], [13]]),
    "empty step": pcp.GlobalBatch([0], [0], [False], [0], [[0]]),
}


@pytest.mark.parametrize("name", sorted(EDGES))
@pytest.mark.parametrize("dcp", [False, True])
def test_edge_cases(name, dcp):
    cfg = PCPConfig(pcp_size=2, dcp_size=2 if dcp else 1, block_size=8, max_num_seqs=4)
    check_layout(cfg, EDGES[name])
    check_extents(cfg, EDGES[name])
    if not dcp:
        check_ring(cfg, EDGES[name])


def test_short_prefill_split_and_replication():
    batch = EDGES["short prefill"]
    pcp_only = pcp.layout(PCPConfig(pcp_size=2, block_size=8), batch)
    assert [[(r.offset, r.length) for r in rows] for rows in pcp_only.rows] == [
        [(0, 2)], [(2, 2), (4, 1)]]  # chunk 3 is empty: rank 0 holds one row
    with_dcp = pcp.layout(PCPConfig(pcp_size=2, dcp_size=2, block_size=8), batch)
    assert all(rows == [pcp.Row(0, 0, 5, True)] for rows in with_dcp.rows)
    assert with_dcp.write_mask == [True] * 5 + [False] * 5
