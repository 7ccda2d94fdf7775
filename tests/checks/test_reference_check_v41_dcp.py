"""The reference check on a DeepSeek V4.1 rank under decode context parallelism: every
builder of the rank (both indexers, the compressed builder, the SWA builder) is compared with
the rank's reference, so a true build passes and a rank's slot written as on one GPU is
named."""

from __future__ import annotations

import numpy as np
import torch
from helpers.support import DEVICE, quiet
from helpers.v41_steps import SMALL

from staticattn.arena import ArenaConfig, cache_groups
from staticattn.builders import CompressedMetadataBuilder, default_builders, make_arena
from staticattn.checks import reference_mismatch
from staticattn.graphs import GraphManager


def _manager(rank: int) -> GraphManager:
    cfg = ArenaConfig.preset("deepseek-v4.1-flash", **SMALL, dcp_world_size=2, dcp_rank=rank,
                             cp_kv_cache_interleave_size=2, device=DEVICE)
    builders = default_builders(cfg)
    arena, inputs = make_arena(cfg, builders)
    for table in [inputs.block_table, inputs.swa_block_table] + [
            inputs.block_tables[g.name] for g in cache_groups(cfg)]:
        rows, cols = table.shape
        table.copy_(torch.arange(1, 1 + rows * cols, dtype=torch.int32).reshape(rows, cols)
                    % 4000)
    return GraphManager(arena, inputs, builders, lambda batch, md: None, quiet())


def test_every_rank_passes_a_true_build_and_a_global_slot_is_named(monkeypatch):
    q, s = np.array([2, 2, 40], dtype=np.int32), np.array([300, 9, 40], dtype=np.int32)
    slots = np.arange(44, dtype=np.int64)
    for rank in (0, 1):
        with _manager(rank) as gm:
            assert reference_mismatch(gm, q, s, slots) is None
    build = CompressedMetadataBuilder.build

    def unsharded(self, batch):
        meta = build(self, batch)
        meta.types["c1a"].slot_mapping[0] = 4  # position 298's entry, rank 1's, written here
        return meta

    monkeypatch.setattr(CompressedMetadataBuilder, "build", unsharded)
    with _manager(0) as gm:
        assert reference_mismatch(gm, q, s, slots) == (
            "compressed: c1a.slot_mapping[0]: got 4, expected -1")
