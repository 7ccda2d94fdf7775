"""What the commands draw and check on a DeepSeek V4.1 arena, on any device: random steps
write the rows of every cache group's table (the columns their lengths need, a ring its one
block), and the eager checks (``check_eagerly``, the checker's CPU half) compare both
indexers, the compressed KV and the SWA builds with the reference, the gather consumer fed
by the graph builds against the one fed by the reference builds."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.support import READER_BACKEND, quiet
from helpers.v41_steps import v41_config

from staticattn.arena import ArenaConfig, cache_groups
from staticattn.bench.random_batches import (
    DecodeStream,
    group_columns,
    random_mixed_step,
    random_uniform_decode,
)
from staticattn.builders import default_builders, make_arena
from staticattn.checks.reference_check import check_eagerly
from staticattn.consumers import GatherConsumer
from staticattn.graphs import GraphManager


def _world(backend: str = "torch"):
    cfg = v41_config("flash-n2", backend)
    builders = default_builders(cfg)
    arena, inputs = make_arena(cfg, builders)
    return cfg, builders, arena, inputs


def test_group_columns_follow_the_entries_of_a_type():
    cfg, _, _, _ = _world()
    groups = {g.name: g for g in cache_groups(cfg)}
    # 64-token blocks: c1a 64 entries a block, c2a 32; 1000 tokens -> 1000 / 500 entries.
    assert group_columns(groups["c1a.compressed_kv"], 1000) == 16
    assert group_columns(groups["c2a.index_k"], 1000) == 16
    assert group_columns(groups["c2a.index_k"], 1024) == 16
    assert group_columns(groups["c2a.index_k"], 1025) == 17
    assert group_columns(groups["c2a.compressor_state"], 1000) == 1


def test_random_steps_fill_the_rank_s_columns_under_dcp():
    """Under DCP a sharded group's column spans ``R * S * W`` tokens and the main table's
    ``block_size * W``: a step at the context limit fills the rank's narrower tables."""
    cfg = ArenaConfig.preset("deepseek-v4.1-flash", device="cpu", max_model_len=4096,
                             max_num_seqs=4, max_num_batched_tokens=64, dcp_world_size=2,
                             cp_kv_cache_interleave_size=2)
    arena, inputs = make_arena(cfg, default_builders(cfg))
    step = random_uniform_decode(inputs, 2, np.random.default_rng(0), num_kv_blocks=100,
                                 max_seq_len=4096, short_fraction=0.0)
    longest = int(step.seq_lens.max())
    assert group_columns(next(g for g in cache_groups(cfg) if g.name == "c1a.index_k"),
                         4096) == 4096 // (64 * 2)
    for g in cache_groups(cfg):
        assert group_columns(g, longest) <= inputs.block_tables[g.name].shape[1], g.name


@pytest.mark.parametrize("draw", ["uniform", "mixed", "stream"])
def test_random_steps_write_every_group_table(draw):
    cfg, _, _, inputs = _world()
    for table in inputs.block_tables.values():
        table.zero_()
    rng = np.random.default_rng(3)
    if draw == "uniform":
        step = random_uniform_decode(inputs, 4, rng, num_kv_blocks=100, max_seq_len=3000)
    elif draw == "mixed":
        step = random_mixed_step(inputs, rng, num_kv_blocks=100, max_seq_len=3000)
    else:
        step = DecodeStream(inputs, rng, max_seq_len=3000, num_kv_blocks=100).next(4)
    longest = int(step.seq_lens.max()) if draw != "stream" else 3000
    rows = step.seq_lens.shape[0]
    for g in cache_groups(cfg):
        written = inputs.block_tables[g.name][:rows].cpu()
        cols = group_columns(g, longest)
        assert ((written[:, :cols] >= 1) & (written[:, :cols] < 100)).all(), g.name
        assert (written[:, cols:] == 0).all(), g.name


def test_check_eagerly_compares_every_v41_builder(backend):
    cfg, builders, arena, inputs = _world(backend)
    reader = GatherConsumer(cfg, num_kv_blocks=4096, backend=READER_BACKEND)
    with GraphManager(arena, inputs, builders, reader, quiet()) as gm:
        check = check_eagerly(gm, num_steps=4 if backend == "torch" else 2, seed=1,
                              max_seq_len=3000)
    assert check.compared == ("indexer.c1a", "indexer.c2a", "compressed", "swa")
    assert check.steps > 0 and check.ok, check.lines()
