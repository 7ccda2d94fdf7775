"""DeepSeek V4.1's compressor-ring links inside a PCP rank's step build: a V4.1 rank's arena
declares them (``R = 2 * max_num_seqs`` rows a rank, -1 before the first step), a V3.2
rank's does not, and :func:`~staticattn.builders.pcp.rank_step.build_rank_step` writes
them from the staged global batch, each request's ring block read from column 0 of its row
of the ring's table (the compressor-state group): §4.2's worked example 4 on every rank and
drawn batches, against the oracle (:mod:`staticattn.reference.pcp_ring`)."""

from __future__ import annotations

import functools

import pytest
import torch
from helpers.pcp_batches import fresh_prefills, pcp_cases, staged
from helpers.support import DEVICE, fuzz_examples
from hypothesis import HealthCheck, given, settings

from staticattn.arena import ArenaConfig
from staticattn.arena.pcp_config import PCPConfig
from staticattn.builders import make_arena
from staticattn.builders.pcp.rank_step import build_rank_step
from staticattn.builders.pcp.rank_views import PCPLayout, PCPViews
from staticattn.reference import pcp_layout as pcp
from staticattn.reference import pcp_ring as ring

#: Requests a step (the drawn batches' most), tokens a rank and global tokens.
MAX_REQS, NUM_TOKENS, MAX_TOKENS = 6, 256, 256


@functools.cache
def _rank(pcp_size: int, preset: str = "deepseek-v4.1-flash", backend: str = "torch"):
    """A rank's PCP config, views and inputs (an arena holding the PCP views only; the
    Triton backend's on the test device)."""
    arch = ArenaConfig.preset(preset, device="cpu").architecture
    cfg = PCPConfig(pcp_size=pcp_size, architecture=arch, max_num_seqs=MAX_REQS)
    config = ArenaConfig.preset(preset, device=DEVICE if backend == "triton" else "cpu",
                                max_num_seqs=cfg.max_rows,
                                max_num_batched_tokens=NUM_TOKENS, max_model_len=512,
                                kernel_backend=backend, num_speculative_tokens=0)
    layout = PCPLayout(cfg, NUM_TOKENS, MAX_TOKENS)
    _, inputs = make_arena(config, [layout])
    return cfg, layout.views, inputs


def _stage(views: PCPViews, batch: pcp.GlobalBatch, ring_blocks: list[int]) -> None:
    """The engine's work before a step: the global batch into the pinned staging, each
    request's ring block into column 0 of the ring's table."""
    inputs = staged(batch, MAX_REQS)
    host = views.host_batch
    host[0].copy_(inputs["query_start_loc"])
    for row, name in enumerate(("is_prefilling", "num_computed", "req_state_idx"), start=1):
        host[row, :MAX_REQS].copy_(inputs[name])
    table = views.tables[views.ring.table]
    table.zero_()
    table[:len(ring_blocks), 0] = torch.tensor(ring_blocks, dtype=torch.int32)


def _links(views: PCPViews) -> tuple[list[list[int]], list[int]]:
    return views.ring.prev_row_indices.tolist(), views.ring.ring_write_slots.tolist()


def _want(cfg: PCPConfig, batch: pcp.GlobalBatch,
          ring_blocks: list[int]) -> tuple[list[list[int]], list[int]]:
    R = cfg.max_rows
    want = ring.ring_links(batch, pcp.layout(cfg, batch, NUM_TOKENS), ring_blocks, R)
    return ([links + [-1] * (R - len(links)) for links in want["prev_row_indices"]],
            want["ring_write_slots"])


def test_only_a_model_with_a_ratio_2_ring_declares_the_links():
    cfg, views, _ = _rank(2)
    assert views.ring.table == "block_tables.c2a.compressor_state"
    assert views.ring.capacity == 8
    assert views.ring.prev_row_indices.shape == (2, cfg.max_rows)
    assert views.ring.ring_write_slots.shape == (2 * cfg.max_rows,)
    assert views.ring.prev_row_indices.dtype == torch.int32
    assert views.ring.ring_write_slots.dtype == torch.int64
    assert _rank(2, "deepseek-v3.2")[1].ring is None


@pytest.mark.parametrize("rank", range(4))
def test_worked_example_4_on_every_rank(backend, rank):
    """P = 4, q = (37, 100), ring blocks A -> 5, B -> 9; here ``max_num_seqs = 6``, so
    R = 12 and gathered row ``rank * 12 + row`` (the spec's R = 8 runs on gloo ranks)."""
    cfg, views, inputs = _rank(4, backend=backend)
    _stage(views, fresh_prefills(), [5, 9])
    build_rank_step(cfg, views, inputs, rank)
    prev, write = _links(views)
    pad = [-1] * 8
    assert prev == [[-1, 13, -1, 15] + pad, [0, -1, 2, -1] + pad, [-1, 37, -1, 39] + pad,
                    [24, -1, 26, -1] + pad]
    assert write == [-1, 44] + [-1] * 46
    assert (prev, write) == _want(cfg, fresh_prefills(), [5, 9])


def test_drawn_batches(backend):
    @settings(max_examples=fuzz_examples(backend, 20, 8), deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(pcp_cases(dcp=False))
    def check(case):
        drawn, batch = case
        cfg, views, inputs = _rank(drawn.pcp_size, backend=backend)
        blocks = [5 + 4 * i for i in range(len(batch.query_lens))]
        # The Triton kernel writes every link: stale ones must not survive.
        views.ring.prev_row_indices.fill_(3)
        views.ring.ring_write_slots.fill_(3)
        _stage(views, batch, blocks)
        build_rank_step(cfg, views, inputs, 0)
        assert _links(views) == _want(cfg, batch, blocks)

    check()
