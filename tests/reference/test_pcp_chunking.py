"""The prefill chunking oracle (§3.5, §3.6): a workspace-limited and a logits-limited split of
the spec's batch, with and without DCP, identical on every rank under DCP; and on drawn items,
what every greedy chunking must satisfy (hypothesis, bounded)."""

from __future__ import annotations

import pytest
from helpers.pcp_batches import fresh_prefills, pcp_cases
from helpers.pcp_views import prefill_meta
from hypothesis import given, settings
from hypothesis import strategies as st

from staticattn.arena.pcp_config import PCPConfig
from staticattn.reference import pcp_chunking as chunking
from staticattn.reference import pcp_layout as pcp

EXAMPLES = 60


def _rank_chunks(cfg: PCPConfig, batch, rank: int, workspace: int, limit: int):
    meta = prefill_meta(cfg, batch, pcp.layout(cfg, batch), rank)
    extents = meta["seq_lens"] if cfg.dcp_size == 1 else meta["shard"]
    return chunking.indexer_chunks(meta["req_idx"], meta["lens"], extents, cfg.dcp_size,
                                   workspace, limit)


@pytest.mark.parametrize("rank", [0, 1])
def test_dcp_workspace_and_logits_limits(rank):
    """P = D = 2, I = 1: A (extent 2*19, charge 2*10) and B (2*50, charge 2*25)."""
    cfg = PCPConfig(pcp_size=2, dcp_size=2)
    both = _rank_chunks(cfg, fresh_prefills(), rank, 138, 10**6)
    assert both == [(0, 4, 0, 70)]
    # Workspace-limited: 38 + 100 > 137, so A and B go apart.
    assert _rank_chunks(cfg, fresh_prefills(), rank, 137, 10**6) == [(0, 2, 0, 20),
                                                                    (2, 4, 0, 50)]
    # Logits-limited: 70 * 138 > 1000 >= 20 * 38; B alone is 50 * 100 > 1000, cut into
    # slices of 1000 // 100 = 10 charged tokens.
    assert _rank_chunks(cfg, fresh_prefills(), rank, 10**6, 1000) == [
        (0, 2, 0, 20)] + [(2, 4, q, q + 10) for q in range(0, 50, 10)]


def test_pcp_only_rows_are_items():
    """P = 2, D = 1, rank 0: rows of seq lens 10, 37, 25, 100 and lengths 10, 7, 25, 25."""
    cfg = PCPConfig(pcp_size=2)
    assert _rank_chunks(cfg, fresh_prefills(), 0, 72, 10**6) == [(0, 3, 0, 42),
                                                                (3, 4, 0, 25)]
    # 100 * 25 > 2000: the last row is cut into slices of 2000 // 100 = 20 tokens.
    assert _rank_chunks(cfg, fresh_prefills(), 0, 10**6, 2000) == [
        (0, 2, 0, 17), (2, 3, 0, 25), (3, 4, 0, 20), (3, 4, 20, 25)]


def test_flashmla_chunks_restart_the_workspace():
    meta = prefill_meta(PCPConfig(pcp_size=2, dcp_size=2), fresh_prefills(),
                        pcp.layout(PCPConfig(pcp_size=2, dcp_size=2), fresh_prefills()), 0)
    one = chunking.flashmla_chunks(meta["req_idx"], meta["shard"], meta["lens"], 69)
    assert one == {"chunks": [(0, 2)], "workspace_starts": [0, 19], "chunk_tot_seqlen": [69],
                   "token_slices": [(0, 67)]}
    two = chunking.flashmla_chunks(meta["req_idx"], meta["shard"], meta["lens"], 68)
    assert two == {"chunks": [(0, 1), (1, 2)], "workspace_starts": [0, 0],
                   "chunk_tot_seqlen": [19, 50], "token_slices": [(0, 17), (17, 67)]}
    with pytest.raises(ValueError, match="exceeds the prefill workspace"):
        chunking.flashmla_chunks(meta["req_idx"], meta["shard"], meta["lens"], 49)


@st.composite
def items(draw):
    n = draw(st.integers(0, 10))
    extents = draw(st.lists(st.integers(0, 60), min_size=n, max_size=n))
    charges = draw(st.lists(st.integers(0, 30), min_size=n, max_size=n))
    return extents, charges, draw(st.integers(1, 120)), draw(st.integers(1, 2000))


@settings(max_examples=EXAMPLES)
@given(items())
def test_greedy_chunks_cover_fit_and_are_maximal(case):
    extents, charges, workspace, limit = case
    chunks = chunking.greedy_chunks(extents, charges, workspace, limit)
    spans = sorted({(a, b) for a, b, _, _ in chunks})
    # Item spans tile the items in order; a span charged 0 tokens has no slice.
    covered = [i for a, b in spans for i in range(a, b)]
    assert covered == [i for i in range(len(extents)) if i in covered]
    for a, b in spans:
        m, n = sum(charges[a:b]), sum(extents[a:b])
        assert b == a + 1 or (n <= workspace and m * n <= limit)
        if b < len(extents) and not (b == a + 1 and (n > workspace or m * n > limit)):
            m2, n2 = m + charges[b], n + extents[b]
            assert n2 > workspace or m2 * n2 > limit  # the greedy stopped for a reason
        slices = [(q0, q1) for x, y, q0, q1 in chunks if (x, y) == (a, b)]
        assert [q for q0, q1 in slices for q in range(q0, q1)] == list(range(m))
        assert n == 0 or all(q1 - q0 <= max(1, limit // n) for q0, q1 in slices)
    assert all(charges[i] == 0 for i in range(len(extents)) if i not in covered)


@settings(max_examples=EXAMPLES)
@given(pcp_cases(), st.integers(8, 200), st.integers(50, 5000))
def test_dcp_chunks_identical_on_every_rank(case, workspace, limit):
    cfg, batch = case
    plans = [_rank_chunks(cfg, batch, p, workspace, limit) for p in range(cfg.pcp_size)]
    if cfg.dcp_size > 1:
        assert all(plan == plans[0] for plan in plans)
