"""Prefill context parallelism across processes on the CPU: 2 and 4 ranks joined by gloo,
each building its pieces of the same global batches on its own. All-gathering every rank's
hidden states (fixed size N each) and indexing them with the restore index gives the global
token order back; the ranks' segments of the gathered slot mapping, all-gathered, equal the
oracle's mapping, each segment under its rank's DCP rank."""

from __future__ import annotations

import functools

import pytest
import torch.distributed as dist
from helpers import dcp_workers, pcp_workers

from staticattn.arena.pcp_config import PCPConfig
from staticattn.reference import pcp_layout as pcp

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="needs torch.distributed with gloo")


# PCP alone on 2 and 4 ranks runs through the demo's path in test_pcp_ranks; here PCP + DCP.
@pytest.mark.parametrize(("world", "dcp"), [(2, True), (4, True)])
def test_ranks_restore_the_global_order(tmp_path, world, dcp):
    target = functools.partial(pcp_workers.gathered_steps, world=world, dcp=dcp, steps=20)
    records = dcp_workers.spawn_ranks(target, tmp_path, world)
    cfg = PCPConfig(pcp_size=world, dcp_size=world if dcp else 1, block_size=8,
                    cp_kv_cache_interleave_size=2, max_num_seqs=pcp_workers.MAX_REQS)
    N = pcp_workers.NUM_TOKENS
    for step in zip(*(r["steps"] for r in records)):
        batch = pcp.GlobalBatch(**step[0]["batch"])
        lay = pcp.layout(cfg, batch, N)
        # Segment p was built by rank p, with its own DCP rank.
        want = [pcp.gathered_slots(cfg, batch, lay, cfg.dcp_rank(p))[p * N:(p + 1) * N]
                for p in range(world)]
        for got in step:
            assert got["restored"] == list(range(batch.query_start_loc[-1]))
            assert got["slot_segments"] == want
