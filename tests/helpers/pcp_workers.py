"""The per-rank body of the multi-process prefill-context-parallel test
(``distributed/test_pcp_gloo.py``): each rank joins a gloo group over a file store, builds its
pieces of the same global batches, all-gathers its fixed-size segments and writes what it
gathered to ``<out>/rank<r>.json``. Spawned through :func:`helpers.dcp_workers.run`."""

from __future__ import annotations

import json
import os
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from helpers.pcp_batches import staged
from staticattn.arena.pcp_config import PCPConfig
from staticattn.builders.pcp.rank_fields import gathered_slots
from staticattn.builders.pcp.rank_rows import RowViews, build_rows
from staticattn.reference.pcp_layout import GlobalBatch

#: Requests a step and tokens a rank at most: every drawn step fits one padded length.
MAX_REQS, NUM_TOKENS, MAX_TOKENS = 6, 128, 256


def random_batch(rng: np.random.Generator) -> GlobalBatch:
    """Decodes of 1-3 tokens and prefills of 0-40, any order (the same on every rank: one
    seed)."""
    n = int(rng.integers(1, MAX_REQS + 1))
    pre = [bool(x) for x in rng.integers(0, 2, n)]
    q = [int(rng.integers(0, 41)) if p else int(rng.integers(1, 4)) for p in pre]
    computed = [int(x) for x in rng.integers(0, 31, n)]
    blocks = [[int(b) for b in rng.integers(1, 100, 16)] for _ in range(n)]
    return GlobalBatch(q, computed, pre, list(range(n)), blocks)


def gathered_steps(rank: int, out: str, world: int, dcp: bool, steps: int) -> None:
    """For each step: this rank's ``hidden`` (each local token's global index, as a float
    hidden state) and its segment of the gathered slot mapping, all-gathered over the ranks;
    then the gathered hidden states restored to global order."""
    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    cfg = PCPConfig(pcp_size=world, dcp_size=world if dcp else 1, block_size=8,
                    cp_kv_cache_interleave_size=2, max_num_seqs=MAX_REQS)
    rng = np.random.default_rng(1234)
    rows = RowViews.allocate(cfg, NUM_TOKENS, MAX_TOKENS)
    slots = torch.empty(world * NUM_TOKENS, dtype=torch.int64)
    records = []
    for _ in range(steps):
        batch = random_batch(rng)
        inputs = staged(batch, MAX_REQS)
        build_rows(cfg, inputs["query_start_loc"], inputs["is_prefilling"],
                   inputs["num_computed"], rows)
        gathered_slots(cfg, rows, inputs["block_table"], cfg.dcp_rank(rank), slots)
        hidden = torch.where(rows.write_mask[rank], rows.token_to_global[rank], -1).float()
        every = [torch.empty_like(hidden) for _ in range(world)]
        dist.all_gather(every, hidden)
        segment = slots.view(world, NUM_TOKENS)[rank].clone()
        every_slots = [torch.empty_like(segment) for _ in range(world)]
        dist.all_gather(every_slots, segment)
        T = batch.query_start_loc[-1]
        restored = torch.cat(every)[rows.hidden_restore_idx[:T].long()]
        records.append({"batch": batch.__dict__, "restored": restored.long().tolist(),
                        "slot_segments": torch.stack(every_slots).tolist()})
    dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"steps": records}, f)
