"""The device chunking (builders/pcp/chunk_split) against the oracle: the greedy on drawn
items, the indexer's chunks of every rank (rows under D = 1, requests widened to rows under
DCP) and FlashMLA's, on the spec's batch and drawn batches; past the count every chunk is
``[count, count)`` with an empty query slice, and a plan cut short still reports its count."""

from __future__ import annotations

import pytest
import torch
from helpers.pcp_batches import fresh_prefills, pcp_cases, staged
from helpers.pcp_views import device_fields, device_rows, prefill_meta
from hypothesis import given, settings
from hypothesis import strategies as st

from staticattn.arena.pcp_config import PCPConfig
from staticattn.builders.pcp.chunk_split import (
    ChunkPlan,
    build_flashmla_chunks,
    build_indexer_chunks,
    greedy_chunks,
)
from staticattn.reference import pcp_chunking as chunking
from staticattn.reference import pcp_layout as pcp

EXAMPLES = 40
MAX_CHUNKS = 64


def _listed(out: ChunkPlan) -> list[tuple[int, int, int, int]]:
    return list(zip(out.item_start.tolist(), out.item_end.tolist(), out.query_start.tolist(),
                    out.query_end.tolist()))


def _expect(want: list[tuple[int, int, int, int]], count: int, size: int = MAX_CHUNKS):
    return (want + [(count, count, 0, 0)] * size)[:size]


@settings(max_examples=EXAMPLES)
@given(st.integers(1, 12).flatmap(lambda R: st.tuples(
    st.lists(st.integers(0, 60), min_size=R, max_size=R),
    st.lists(st.integers(0, 30), min_size=R, max_size=R), st.integers(0, R),
    st.integers(1, 120), st.none() | st.integers(1, 2000))))
def test_greedy_matches_the_oracle(case):
    extents, charges, count, workspace, limit = case
    want = chunking.greedy_chunks(extents[:count], charges[:count], workspace, limit)
    for size in (MAX_CHUNKS, 2):  # 2: cut short, the count still says how many
        out = ChunkPlan.allocate(size, len(extents))
        greedy_chunks(torch.tensor(extents), torch.tensor(charges), torch.tensor(count),
                      workspace, limit, out)
        assert _listed(out) == _expect(want, count, size)
        assert out.num_chunks.item() == len(want)


def check_chunks(cfg: PCPConfig, batch: pcp.GlobalBatch, workspace: int, limit: int) -> None:
    lay = pcp.layout(cfg, batch)
    inputs = staged(batch, cfg.max_num_seqs)
    rows = device_rows(cfg, inputs, lay.N)
    for p in range(cfg.pcp_size):
        meta = prefill_meta(cfg, batch, lay, p)
        fields = device_fields(cfg, rows, inputs, p)
        extents = meta["seq_lens"] if cfg.dcp_size == 1 else meta["shard"]
        want = chunking.indexer_chunks(meta["req_idx"], meta["lens"], extents, cfg.dcp_size,
                                       workspace, limit)
        out = build_indexer_chunks(cfg, rows, fields, p, workspace, limit,
                                   ChunkPlan.allocate(MAX_CHUNKS, cfg.max_rows))
        assert _listed(out) == _expect(want, len(meta["lens"]))
        assert out.num_chunks.item() == len(want)
        if cfg.dcp_size == 1 or max(meta["shard"], default=0) > workspace:
            continue
        entries = chunking.flashmla_chunks(meta["req_idx"], meta["shard"], meta["lens"],
                                           workspace)
        out = build_flashmla_chunks(rows, fields, p, workspace,
                                    ChunkPlan.allocate(MAX_CHUNKS, cfg.max_rows))
        n = len(entries["workspace_starts"])
        assert _listed(out) == _expect([(a, b, 0, 0) for a, b in entries["chunks"]], n)
        assert out.extent.tolist() == (entries["chunk_tot_seqlen"] + [0] * MAX_CHUNKS)[
            :MAX_CHUNKS]
        assert out.workspace_starts.tolist() == entries["workspace_starts"] + [0] * (
            cfg.max_rows - n)


@pytest.mark.parametrize(("dcp_size", "workspace", "limit"),
                         [(1, 72, 10**6), (1, 10**6, 2000), (2, 137, 10**6), (2, 10**6, 1000),
                          (2, 68, 10**6)])
def test_spec_batch(dcp_size, workspace, limit):
    check_chunks(PCPConfig(pcp_size=2, dcp_size=dcp_size, max_num_seqs=4), fresh_prefills(),
                 workspace, limit)


@settings(max_examples=EXAMPLES)
@given(pcp_cases(), st.integers(8, 200), st.integers(50, 5000))
def test_drawn_batches(case, workspace, limit):
    check_chunks(*case, workspace, limit)
