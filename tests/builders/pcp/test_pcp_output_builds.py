"""The device outputs around the PCP layout against the oracle: the §3.3 cache-write slots
(the same tokens at the same slots as vLLM's slicing, with and without DCP, and the
unexpanded draft mapping), the top-k -> workspace-row conversion (worked example 3 and drawn
tokens over chunked workspaces), each rank's logits indices and maxima, and the
de-interleaving gather at the device's ``deinterleave_idx``."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from helpers.pcp_batches import fresh_prefills, pcp_cases, staged
from helpers.pcp_views import device_fields, device_rows, prefill_meta
from hypothesis import given, settings
from hypothesis import strategies as st

from staticattn.arena.pcp_config import PCPConfig
from staticattn.builders.pcp.cache_write import cache_write_slots
from staticattn.builders.pcp.chunk_split import ChunkPlan, build_flashmla_chunks
from staticattn.builders.pcp.kv_plan import PrefillExtents, build_prefill_extents
from staticattn.builders.pcp.rank_bounds import deinterleave, rank_bounds
from staticattn.builders.pcp.workspace_rows import topk_workspace_rows
from staticattn.reference import pcp_chunk_plan as plan
from staticattn.reference import pcp_chunking as chunking
from staticattn.reference import pcp_layout as pcp
from staticattn.reference import pcp_outputs as outputs

EXAMPLES = 30
WORKSPACE = 1024


def _setup(cfg, batch):
    lay = pcp.layout(cfg, batch)
    inputs = staged(batch, cfg.max_num_seqs)
    return lay, inputs, device_rows(cfg, inputs, lay.N)


@settings(max_examples=EXAMPLES)
@given(pcp_cases())
def test_cache_write_slots(case):
    cfg, batch = case
    lay, _, rows = _setup(cfg, batch)
    P, N = cfg.pcp_size, lay.N
    for p in range(P):
        d = cfg.dcp_rank(p)
        slot = pcp.gathered_slots(cfg, batch, lay, d)
        nd = rows.query_start_loc[p, rows.num_decode_rows[p]]
        want_rows, want_slots = outputs.cache_write_rows(slot, p, int(nd), N, cfg.dcp_size, P)
        token = lambda src: lay.padded_gather_idx[src[0] * N + src[1]]
        want = Counter((token(r), s) for r, s in zip(want_rows, want_slots) if s >= 0)
        out = cache_write_slots(torch.tensor(slot), nd, N, torch.empty(P * N, dtype=torch.int64))
        got = Counter((lay.padded_gather_idx[k], s) for k, s in enumerate(out.tolist()) if s >= 0)
        assert got == want
        unexpanded = torch.arange(N) + 7
        out = cache_write_slots(unexpanded, nd, N, torch.empty(N, dtype=torch.int64))
        assert out.tolist() == outputs.cache_write_rows(unexpanded.tolist(), p, int(nd), N,
                                                        cfg.dcp_size, P)[1] + [-1] * (N - nd)


@pytest.mark.parametrize(("interleave", "tokens", "want"), [
    (1, {9: [0, 1, 2, 9], 36 - 20: [0, 35, 36, -1], 17 + 49: [0, 1, 98, 99]},
     {9: [0, 69, 1, 73], 16: [0, 86, 18, -1], 66: [19, 88, 68, 137]}),
    (64, {66: [0, 63, 64, 99]}, {66: [37, 100, 138, 173]}),
])
def test_topk_worked_example_3(interleave, tokens, want):
    """Rank 0 of P = D = 2: local token 9 is A pos 9, 16 is A pos 36, 66 is B pos 99."""
    cfg = PCPConfig(pcp_size=2, dcp_size=2, cp_kv_cache_interleave_size=interleave,
                    max_num_seqs=4)
    _, inputs, rows = _setup(cfg, fresh_prefills())
    ext = build_prefill_extents(cfg, rows, device_fields(cfg, rows, inputs, 0), 0,
                                PrefillExtents.allocate(cfg, 70, WORKSPACE))
    topk = torch.full((70, 4), -1, dtype=torch.int32)
    for t, values in tokens.items():
        topk[t] = torch.tensor(values)
    total = ext.totals[1].expand(cfg.max_rows)
    out, lengths = torch.empty_like(topk), torch.empty(70, dtype=torch.int32)
    topk_workspace_rows(topk, ext.request_ids, ext.workspace_starts, total, 2, interleave,
                        64, 4, out, lengths)
    for t, rows_want in want.items():
        assert out[t].tolist() == rows_want
        assert lengths[t] == sum(v >= 0 for v in rows_want)


@settings(max_examples=EXAMPLES)
@given(pcp_cases(), st.integers(40, 200), st.randoms(use_true_random=False))
def test_topk_rows_over_chunked_workspaces(case, workspace, rng):
    cfg, batch = case
    if cfg.dcp_size == 1:
        return
    lay, inputs, rows = _setup(cfg, batch)
    bs, width, K = cfg.block_size, 16, 6
    for p in range(cfg.pcp_size):
        meta = prefill_meta(cfg, batch, lay, p)
        if max(meta["shard"], default=0) > workspace:
            continue
        fields = device_fields(cfg, rows, inputs, p)
        ext = build_prefill_extents(cfg, rows, fields, p,
                                    PrefillExtents.allocate(cfg, lay.N, WORKSPACE))
        chunks = build_flashmla_chunks(rows, fields, p, workspace,
                                       ChunkPlan.allocate(cfg.max_rows, cfg.max_rows))
        entry = torch.arange(cfg.max_rows)
        own = torch.searchsorted(chunks.item_start[:chunks.num_chunks.item()].contiguous(),
                                 entry.int(), right=True) - 1
        total = chunks.extent[own.clamp(min=0)]
        topk = torch.tensor([[rng.randrange(-1, 2 * bs * width) for _ in range(K)]
                             for _ in range(lay.N)], dtype=torch.int32).reshape(lay.N, K)
        out, lengths = torch.empty_like(topk), torch.empty(lay.N, dtype=torch.int32)
        topk_workspace_rows(topk, ext.request_ids, chunks.workspace_starts, total,
                            cfg.dcp_size, cfg.cp_kv_cache_interleave_size, bs, width, out,
                            lengths)
        entries = chunking.flashmla_chunks(meta["req_idx"], meta["shard"], meta["lens"],
                                           workspace)
        totals = [t for (a, b), t in zip(entries["chunks"], entries["chunk_tot_seqlen"])
                  for _ in range(a, b)]
        request_ids = ext.request_ids.tolist()
        for t in range(lay.N):
            k = request_ids[t]
            want = ([-1] * K, 0) if k < 0 else plan.workspace_rows(
                topk[t].tolist(), entries["workspace_starts"][k], totals[k], cfg.dcp_size,
                cfg.cp_kv_cache_interleave_size, bs, width)
            assert (out[t].tolist(), lengths[t].item()) == want


@settings(max_examples=EXAMPLES)
@given(pcp_cases())
def test_rank_bounds_and_deinterleave(case):
    cfg, batch = case
    lay, inputs, rows = _setup(cfg, batch)
    R = cfg.max_rows
    for p in range(cfg.pcp_size):
        meta = pcp.rank_metadata(cfg, batch, lay, p, cfg.dcp_rank(p))
        fields = device_fields(cfg, rows, inputs, p)
        logits, maxima = torch.empty(R, dtype=torch.int32), torch.empty(2, dtype=torch.int32)
        rank_bounds(rows, fields, p, logits, maxima)
        want = outputs.rank_bounds(meta["query_start_loc"], meta["seq_lens_upper"])
        n = len(want["logits_indices"])
        assert logits.tolist() == want["logits_indices"] + [lay.num_tokens[p] - 1] * (R - n)
        assert maxima.tolist() == [want["max_query_len"], want["max_seq_len"]]
        if cfg.dcp_size == 1:
            continue
        pre = prefill_meta(cfg, batch, lay, p)
        gplan = plan.global_chunk_plan(pre["req_idx"], pre["shard"], cfg.dcp_size,
                                       cfg.cp_kv_cache_interleave_size)
        lens = pre["region_lens"]
        shards = torch.tensor(outputs.gathered_shards(gplan, lens, cfg.dcp_size,
                                                      cfg.cp_kv_cache_interleave_size) or [0])
        ext = build_prefill_extents(cfg, rows, fields, p,
                                    PrefillExtents.allocate(cfg, lay.N, WORKSPACE))
        got = deinterleave(shards, ext.deinterleave_idx, torch.empty(WORKSPACE,
                                                                     dtype=shards.dtype))
        want_regions = outputs.deinterleaved_positions(gplan, lens, cfg.dcp_size,
                                                       cfg.cp_kv_cache_interleave_size)
        assert got[:gplan.total].tolist() == [x for region in want_regions for x in region]
