"""The prefill-context-parallel split and the prefill extents on both kernel backends (the
torch ops and the Triton kernels of :mod:`staticattn.kernels.pcp.split_rows` and
:mod:`staticattn.kernels.pcp.prefill_extents`), against the oracle field by field
(:func:`test_pcp_device_builds.check_layout`'s and ``check_extents``' checks), on the spec's
examples, its edge cases and drawn batches; every field of the two backends' rows equal,
stale values in the views overwritten; and what only the restore reads (each request's
first row on each rank, a replicated request's computing rank) against the oracle's rows."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers.pcp_batches import fresh_prefills, pcp_cases, staged
from helpers.pcp_views import MAX_TOKENS
from helpers.support import DEVICE, fuzz_examples
from hypothesis import HealthCheck, given, settings
from test_pcp_device_builds import EDGES, check_extents, check_layout

from staticattn.arena.pcp_config import PCPConfig
from staticattn.builders.pcp.rank_rows import RowViews, build_rows
from staticattn.kernels.pcp import split_rows
from staticattn.reference import pcp_layout as pcp


def _rows(cfg: PCPConfig, batch: pcp.GlobalBatch, backend: str, N: int,
          stale: int = 0) -> RowViews:
    """The backend's rows of ``batch`` on the test device, every view first filled with
    ``stale``."""
    inputs = {k: v.to(DEVICE) for k, v in staged(batch, cfg.max_num_seqs).items()}
    out = RowViews.allocate(cfg, N, MAX_TOKENS, DEVICE)
    for f in dataclasses.fields(out):
        getattr(out, f.name).fill_(stale)
    return build_rows(cfg, inputs["query_start_loc"], inputs["is_prefilling"],
                      inputs["num_computed"], out, backend)


def check_split(cfg: PCPConfig, batch: pcp.GlobalBatch, backend: str) -> None:
    """The backend's rows and extents (entries of 1 and 4 tokens) against the oracle and,
    field by field, its rows against the torch ops' (written over views holding stale
    values); each request's first row and owner."""
    check_layout(cfg, batch, backend)
    for ratio in (1, 4):
        check_extents(cfg, batch, ratio, backend)
    lay = pcp.layout(cfg, batch)
    want = _rows(cfg, batch, "torch", lay.N)
    got = _rows(cfg, batch, backend, lay.N, stale=77)
    for f in dataclasses.fields(want):
        assert torch.equal(getattr(got, f.name), getattr(want, f.name)), f.name
    owner = got.req_owner.tolist()
    for i in range(len(batch.query_lens)):
        on = [p for p, rows in enumerate(lay.rows) if any(r.req == i for r in rows)]
        whole = [p for p in on if any(r.req == i and r.replicated for r in lay.rows[p])]
        if whole:  # computed by the one that holds it (D = 1), by rank 0 (D > 1)
            assert owner[i] == whole[0], (i, owner)
        else:
            assert owner[i] == -1, (i, owner)
        for p in on:
            first = next(k for k, r in enumerate(lay.rows[p]) if r.req == i)
            assert got.req_first_row[p, i] == first, (p, i)
    assert owner[len(batch.query_lens):] == [-1] * (cfg.max_num_seqs - len(batch.query_lens))


@pytest.mark.parametrize(("pcp_size", "dcp_size"), [(2, 1), (4, 1), (2, 2), (4, 4)])
def test_spec_example(backend, pcp_size, dcp_size):
    cfg = PCPConfig(pcp_size=pcp_size, dcp_size=dcp_size, max_num_seqs=4)
    check_split(cfg, fresh_prefills(), backend)


@pytest.mark.parametrize("name", sorted(EDGES))
@pytest.mark.parametrize("dcp", [False, True])
def test_edge_cases(backend, name, dcp):
    cfg = PCPConfig(pcp_size=2, dcp_size=2 if dcp else 1, block_size=8, max_num_seqs=4)
    check_split(cfg, EDGES[name], backend)


def test_drawn_batches(backend):
    @settings(max_examples=fuzz_examples(backend, 40, 12), deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(pcp_cases())
    def check(case):
        check_split(*case, backend)

    check()


def test_many_requests_span_several_row_tiles(backend):
    """128 requests (256 rows a rank: the rows kernel matches them against the requests
    in several tiles, the query starts carried from tile to tile), decodes and prefills
    interleaved, on 4 ranks with and without DCP."""
    n = 128
    pre = [i % 3 != 0 for i in range(n)]
    q = [(i * 5) % 4 if p else 1 + i % 2 for i, p in enumerate(pre)]
    batch = pcp.GlobalBatch(q, [i % 5 for i in range(n)], pre, list(range(n)),
                            [[1 + i] * 8 for i in range(n)])
    assert split_rows.MATCH_CELLS // n < 2 * n  # more than one tile of rows
    for dcp in (1, 4):
        check_split(PCPConfig(pcp_size=4, dcp_size=dcp, block_size=8, max_num_seqs=n), batch,
                    backend)
