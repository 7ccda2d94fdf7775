"""The worked examples of ``prefill-context-parallel.md`` (§2.4, §3.4-§3.6, §4.2), value for
value, through the prefill-context-parallel oracle."""

from __future__ import annotations

import pytest
from helpers.pcp_batches import fresh_prefills

from staticattn.arena.pcp_config import PCPConfig
from staticattn.reference import pcp_chunk_plan as plan
from staticattn.reference import pcp_layout as pcp
from staticattn.reference import pcp_ring as ring


def _r(a: int, b: int) -> list[int]:
    """``a..b`` inclusive, as the spec writes ranges."""
    return list(range(a, b + 1))


def _spans(rows: list[pcp.Row]) -> list[tuple[str, int, int]]:
    return [("AB"[r.req], r.offset, r.offset + r.length) for r in rows]


def test_example_1_rows_and_metadata():
    cfg, batch = PCPConfig(pcp_size=2), fresh_prefills()
    lay = pcp.layout(cfg, batch)
    assert _spans(lay.rows[0]) == [("A", 0, 10), ("A", 30, 37), ("B", 0, 25), ("B", 75, 100)]
    assert _spans(lay.rows[1]) == [("A", 10, 20), ("A", 20, 30), ("B", 25, 50), ("B", 50, 75)]
    assert (lay.num_tokens, lay.N, len(lay.padded_gather_idx)) == ([67, 70], 70, 140)
    want = {0: ([0, 10, 17, 42, 67], [10, 37, 25, 100], [0, 30, 0, 75]),
            1: ([0, 10, 20, 45, 70], [20, 30, 50, 75], [10, 20, 25, 50])}
    for rank, (qsl, seq_lens, start) in want.items():
        meta = pcp.rank_metadata(cfg, batch, lay, rank)
        assert meta["query_start_loc"] == qsl
        assert meta["seq_lens"] == meta["seq_lens_upper"] == seq_lens
        assert meta["start_pos"] == start
        assert meta["req_idx"] == [3, 3, 7, 7]


def test_example_1_gathered_layout():
    cfg, batch = PCPConfig(pcp_size=2), fresh_prefills()
    lay = pcp.layout(cfg, batch)
    assert lay.padded_gather_idx == (_r(0, 9) + _r(30, 36) + _r(37, 61) + _r(112, 136)
                                     + [0, 0, 0] + _r(10, 29) + _r(62, 111))
    # A0-9 -> 0-9, A10-19 -> 70-79, A20-29 -> 80-89, A30-36 -> 10-16, B0-24 -> 17-41,
    # B25-49 -> 90-114, B50-74 -> 115-139, B75-99 -> 42-66.
    assert lay.hidden_restore_idx == (_r(0, 9) + _r(70, 79) + _r(80, 89) + _r(10, 16)
                                      + _r(17, 41) + _r(90, 114) + _r(115, 139) + _r(42, 66))
    assert [k for k, m in enumerate(lay.write_mask) if not m] == [67, 68, 69]
    assert pcp.gathered_slots(cfg, batch, lay) == (
        _r(640, 649) + _r(670, 676) + _r(1280, 1304) + _r(1355, 1379) + [-1] * 3
        + _r(650, 669) + _r(1305, 1354))


def test_example_1_four_ranks():
    lay = pcp.layout(PCPConfig(pcp_size=4), fresh_prefills())
    assert _spans(lay.rows[0]) == [("A", 0, 5), ("A", 35, 37), ("B", 0, 13), ("B", 91, 100)]
    assert _spans(lay.rows[3]) == [("A", 15, 20), ("A", 20, 25), ("B", 39, 52), ("B", 52, 65)]
    assert lay.num_tokens == [29, 36, 36, 36] and lay.N == 36


def test_indexer_rows_pcp_only():
    """§3.4: rank 0 of the P=2 example, each chunk row its own sequence."""
    cfg, batch = PCPConfig(pcp_size=2), fresh_prefills()
    meta = pcp.rank_metadata(cfg, batch, pcp.layout(cfg, batch), 0)
    lens = [b - a for a, b in zip(meta["query_start_loc"], meta["query_start_loc"][1:])]
    rows = plan.indexer_prefill_extents(meta["seq_lens"], meta["start_pos"], lens)
    assert rows["cu_seq_lens"] == [0, 10, 47, 72, 172]
    assert rows["ke"][:10] == _r(1, 10) and rows["ks"][10:17] == [10] * 7


def _dcp_rank_meta(interleave: int, rank: int):
    cfg = PCPConfig(pcp_size=2, dcp_size=2, cp_kv_cache_interleave_size=interleave)
    batch = fresh_prefills()
    lay = pcp.layout(cfg, batch)
    return cfg, batch, lay, pcp.rank_metadata(cfg, batch, lay, rank, cfg.dcp_rank(rank))


def test_example_2_dcp_lengths_and_slots():
    _, _, lay, meta0 = _dcp_rank_meta(1, 0)
    _, _, _, meta1 = _dcp_rank_meta(1, 1)
    assert _spans(lay.rows[0]) == [("A", 0, 10), ("A", 30, 37), ("B", 0, 25), ("B", 75, 100)]
    assert meta0["dcp_local_seq_lens_upper"] == meta1["dcp_local_seq_lens_upper"] == [
        19, 19, 50, 50]
    assert meta0["dcp_local_seq_lens"] == [5, 19, 13, 50]
    assert meta1["dcp_local_seq_lens"] == [10, 15, 25, 37]
    cfg, batch, lay, _ = _dcp_rank_meta(1, 0)
    assert pcp.gathered_slots(cfg, batch, lay, 0)[:4] == [640, -1, 641, -1]


@pytest.mark.parametrize("rank", [0, 1])
def test_example_2_global_chunk_plan(rank):
    _, _, _, meta = _dcp_rank_meta(1, rank)
    p = plan.global_chunk_plan(meta["req_idx"], meta["dcp_local_seq_lens_upper"], 2, 1)
    assert p.cu_seq_lens == [0, 38, 38, 138, 138] and p.total == 138
    assert p.local_cu_seq_lens == [0, 19, 19, 69, 69] and p.padded_local_total == 69
    assert p.row_start_cu == [0, 0, 38, 38, 138]
    assert p.token_to_seq == [0] * 38 + [2] * 100
    a = [x for t in range(19) for x in (t, 69 + t)]
    b = [x for t in range(19, 69) for x in (t, 69 + t)]
    assert p.deinterleave_idx == a + b
    lens = [y - x for x, y in zip(meta["query_start_loc"], meta["query_start_loc"][1:])]
    ext = plan.chunk_token_extents(p, meta["start_pos"], lens)
    assert ext["ks"] == [0] * (lens[0] + lens[1]) + [38] * (lens[2] + lens[3])
    want = {0: _r(1, 10) + _r(31, 37) + _r(39, 63) + _r(114, 138),
            1: _r(11, 20) + _r(21, 30) + _r(64, 88) + _r(89, 113)}
    assert ext["ke"] == want[rank]


def test_example_2_interleave_64():
    _, _, _, meta = _dcp_rank_meta(64, 0)
    assert meta["dcp_local_seq_lens_upper"] == [37, 37, 64, 64]
    p = plan.global_chunk_plan(meta["req_idx"], meta["dcp_local_seq_lens_upper"], 2, 64)
    assert p.cu_seq_lens == [0, 74, 74, 202, 202]
    assert p.local_cu_seq_lens == [0, 37, 37, 101, 101] and p.padded_local_total == 101
    region_a, region_b = p.deinterleave_idx[:74], p.deinterleave_idx[74:]
    assert region_a == _r(0, 36) + [36] * 27 + _r(101, 110)
    assert region_b == _r(37, 100) + _r(138, 201)


@pytest.mark.parametrize(("interleave", "tokens", "want"), [
    (1, {("A", 9): [0, 1, 2, 9], ("A", 36): [0, 35, 36], ("B", 99): [0, 1, 98, 99]},
     {("A", 9): [0, 69, 1, 73], ("A", 36): [0, 86, 18], ("B", 99): [19, 88, 68, 137]}),
    (64, {("B", 99): [0, 63, 64, 99]}, {("B", 99): [37, 100, 138, 173]}),
])
def test_example_3_flashmla_workspace(interleave, tokens, want):
    _, _, _, meta = _dcp_rank_meta(interleave, 0)
    lens = [y - x for x, y in zip(meta["query_start_loc"], meta["query_start_loc"][1:])]
    entries = plan.flashmla_entries(meta["req_idx"], meta["dcp_local_seq_lens_upper"], lens, 0)
    total = entries["chunk_tot_seqlen"]
    assert (entries["workspace_starts"], total) == (
        ([0, 19], 69) if interleave == 1 else ([0, 37], 101))
    assert entries["request_ids"] == [0] * 17 + [1] * 50
    for (req, _pos), topk in tokens.items():
        start = entries["workspace_starts"]["AB".index(req)]
        rows, count = plan.workspace_rows(topk, start, total, 2, interleave, 64, 4)
        assert rows == want[(req, _pos)] and count == len(topk)


def test_example_4_ring_links():
    cfg, batch = PCPConfig(pcp_size=4, max_num_seqs=4), fresh_prefills()
    lay = pcp.layout(cfg, batch)
    assert _spans(lay.rows[1]) == [("A", 5, 10), ("A", 30, 35), ("B", 13, 26), ("B", 78, 91)]
    assert _spans(lay.rows[2]) == [("A", 10, 15), ("A", 25, 30), ("B", 26, 39), ("B", 65, 78)]
    links = ring.ring_links(batch, lay, ring_block=[5, 9], rows_per_rank=min(lay.N, 8))
    assert links["prev_row_indices"] == [[-1, 9, -1, 11], [0, -1, 2, -1], [-1, 25, -1, 27],
                                         [16, -1, 18, -1]]
    assert links["ring_write_slots"] == [-1, 44] + [-1] * 30
