"""Builds on branches (``GraphOptions.branch_builds``, the default on CUDA): the captured
graphs hold branches that run side by side, and every replayed step leaves the arena as the
one-stream graphs do, byte for byte (every buffer of every builder, padding and flags
included).

Per preset (small capacities, every builder ``default_builders`` gives), two arenas and two
managers, one with branches and one without, replay the same random decode and mixed
steps; after each step the two device blocks are compared whole."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.support import quiet

from staticattn import default_builders, make_arena
from staticattn.arena import ArenaConfig
from staticattn.bench.random_batches import random_mixed_step, random_uniform_decode
from staticattn.graphs import GraphManager
from staticattn.graphs.introspect import longest_chain

pytestmark = pytest.mark.gpu

SMALL = dict(max_num_seqs=16, max_num_batched_tokens=512, max_model_len=8192, device="cuda")
PRESETS = ["deepseek-v3.2", "deepseek-v4", "deepseek-v4.1-flash"]
STEPS = 60


def _manager(cfg: ArenaConfig, branch_builds: bool):
    builders = default_builders(cfg)
    arena, inputs = make_arena(cfg, builders)
    gm = GraphManager(arena, inputs, builders, lambda batch, md: None,
                      quiet(num_kv_blocks=256, branch_builds=branch_builds))
    gm.capture()
    return arena, inputs, gm


@pytest.mark.parametrize("preset", PRESETS)
def test_branches_write_what_one_stream_writes(preset):
    cfg = ArenaConfig.preset(preset, num_speculative_tokens=1, **SMALL)
    worlds = [_manager(cfg, branch_builds=b) for b in (True, False)]
    (arena, inputs, branched), (arena1, inputs1, one_stream) = worlds
    side_by_side = len(branched.capturer.builders) > 1  # V3.2: one builder, no fork
    for g in branched.graphs.values():
        chain = longest_chain(g.graph)
        if chain is not None:  # with cuda-bindings
            assert (chain[0] < chain[1]) == side_by_side, (g.size, chain)
    for g in one_stream.graphs.values():
        chain = longest_chain(g.graph)
        if chain is not None:
            assert chain[0] == chain[1], (g.size, chain)
    rng = np.random.default_rng(7)
    modes = set()
    for i in range(STEPS):
        # The same draws stage the same block-table rows into both worlds.
        state = rng.bit_generator.state
        steps = []
        for ins in (inputs, inputs1):
            rng.bit_generator.state = state
            steps.append(random_uniform_decode(ins, int(rng.integers(1, 9)), rng,
                                               num_kv_blocks=256) if i % 3 == 0
                         else random_mixed_step(ins, rng, num_kv_blocks=256,
                                                max_prefill_tokens=200))
        for (_, _, gm), step in zip(worlds, steps):
            res = gm.run(step.query_lens, step.seq_lens, step.slot_mapping)
            modes.add((res.mode, res.graph_kind))
        torch.cuda.synchronize()
        assert torch.equal(arena.block("device"), arena1.block("device")), (preset, i)
    assert {m for m, _ in modes} == {"graph"}, modes
    assert len({k for _, k in modes}) == 2, modes  # decode graphs and token buckets
