"""DeepSeek V3.2's whole sparse attention under decode context parallelism alone, the real
consumers chained as a model would: each rank's indexer (DeepGEMM's logits, emulated on CPU)
ranks the keys it holds and merges the ranks' local top-k; the merged rows go as they are
to each rank's mixed-batch sparse MLA (FlashMLA's sparse decode, emulated on CPU) over the
batch the indexer read, whose partial outputs merge by their log-sum-exps. Every token of
drawn mixed steps, on every rank: the top-k is the single GPU's (ties allowed) and the
attention the per-token oracle's over that top-k, read from the single GPU's caches. Every
rank in one process (the two all-gathers and the all-reduce played by copies and sums), and
gloo ranks running both consumers whole in two DCP groups side by side."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from helpers import dcp_workers, indexer_dcp
from helpers import sparse_mla_dcp as attention_world
from helpers import v32_dcp as world_of
from helpers.dsa_reference import dequant_indexer_cache
from helpers.sparse_mla_steps import DEVICES as ATTENTION_DEVICES
from helpers.sparse_mla_steps import tiled_cache

STEPS = 3
#: CPU: both kernels' torch emulations; CUDA: DeepGEMM's and FlashMLA's, both needed.
DEVICES = ["cpu", pytest.param("cuda", marks=[*indexer_dcp.DEVICES[1].marks,
                                              *ATTENTION_DEVICES[1].marks[2:]])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("build", ["build", "build_mixed"])
@pytest.mark.parametrize("world,interleave", [(2, 1), (2, 64), (4, 16)])
def test_the_ranks_attend_as_the_single_gpu(world, interleave, build, device):
    ranks = [world_of.make_rank(world, p, interleave, device) for p in range(world)]
    single_keys = indexer_dcp.single_cache(world + interleave)
    keys = dequant_indexer_cache(single_keys)
    single_kv = tiled_cache(indexer_dcp.BLOCKS, "cpu")
    rng = np.random.default_rng(world * 7 + interleave)
    for i in range(STEPS):
        g = indexer_dcp.draw_step(rng, keys, lens=indexer_dcp.OVERFLOW if i == 0 else None)
        queries = world_of.draw_queries(rng, g.q.shape[0])
        # The indexer: each rank's local top-k, the candidates' all-gather, the merge.
        placed = [indexer_dcp.place(r.index, p, world, interleave, g, single_keys, build)
                  for p, r in enumerate(ranks)]
        n = {r.index.step.local_topk_into(md, rows) for r, (md, rows) in zip(ranks, placed)}
        n = n.pop()
        for r in ranks:
            for d, other in enumerate(ranks):
                r.index.step.merge.candidates(n)[d].copy_(
                    other.index.step.merge.candidates(n)[d])
        for r, (_, rows) in zip(ranks, placed):
            r.index.step.merged_into(rows, n)
            assert indexer_dcp.problems(rows, g) == []
        # The attention over each rank's merged rows, as they are.
        for p, r in enumerate(ranks):
            world_of.place_attention(r, p, world, interleave, g, single_kv, queries)
        outs = [r.attention.attend_local(r.index.batch, rows)
                for r, (_, rows) in zip(ranks, placed)]
        attention_world.play_merge([r.attention for r in ranks], outs[0].shape[0])
        topk = placed[0][1][: queries.shape[0]].cpu().numpy()
        for r, o in zip(ranks, outs):
            r.attention.write(r.index.batch, r.attention.partial[: o.shape[0]], r.out)
            assert world_of.attention_problems(r, g, queries, topk, single_kv) == []


def test_gloo_ranks_run_both_consumers_over_their_group(tmp_path):
    target = functools.partial(world_of.rank_steps, world=2, interleave=1, seed=11, steps=4,
                               groups=2)
    dcp_workers.check_records(dcp_workers.spawn_ranks(target, tmp_path, 4))
