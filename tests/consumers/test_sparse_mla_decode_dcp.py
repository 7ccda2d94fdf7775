"""The sparse-MLA decode (DeepSeek V3.2, FlashMLA's sparse FP8 decode) under decode context
parallelism: each rank holds its share of every request's keys (the spec's ownership rule,
interleave 1 and one of a page), keeps the top-k entries it holds, attends over them, and
the partial outputs merge by their log-sum-exps over the group -- every decode token's
merged row is the single-GPU oracle's attention over its whole top-k, including tokens
whose entries all lie on one rank (the others' LSE -inf) and entries past the token. Every
rank in one process (the LSE all-gather and the output all-reduce played by copies and
sums; FlashMLA emulated on CPU, the real kernel on CUDA), and gloo ranks running the
consumer whole."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from helpers import dcp_workers
from helpers import sparse_mla_dcp as world_of
from helpers.sparse_mla_steps import DEVICES, tiled_cache

#: (world, interleave, speculative tokens).
CASES = [(2, 1, 0), (2, 64, 0), (4, 1, 0), (2, 1, 1)]
STEPS = 4


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("build", ["build", "build_mixed"])
@pytest.mark.parametrize("world,interleave,spec", CASES)
def test_merged_decode_rows_are_the_single_gpu_attention(world, interleave, spec, build,
                                                         device):
    """The eager build's native decode rows, or a token bucket's (MTP rows flattened, the
    bucket's decode capacity past the step's decode tokens)."""
    ranks = [world_of.make_rank(world, p, interleave, device, spec) for p in range(world)]
    single = tiled_cache(world_of.BLOCKS, "cpu")
    rng = np.random.default_rng(world * 10 + interleave + spec)
    seen = {"tokens": 0, "one rank only": 0}
    for _ in range(STEPS):
        q_lens, seq, table = world_of.draw_step(rng, spec)
        queries, topk, ref = world_of.draw_inputs(rng, q_lens, seq, table, single)
        placed = [world_of.place(r, p, world, interleave, q_lens, seq, table, single, queries,
                                 topk, build) for p, r in enumerate(ranks)]
        outs = [r.consumer.attend_local(md, rows) for r, (md, rows) in zip(ranks, placed)]
        t = outs[0].shape[0]  # the decode capacity: past the decode tokens, rows not kept
        world_of.play_merge([r.consumer for r in ranks], t)
        for r, (md, _) in zip(ranks, placed):
            r.consumer.write(md, r.consumer.partial[:t], r.out)
            td = world_of.decode_tokens(md)
            assert world_of.problems(r, td, ref, single, table, q_lens, seq, topk) == []
        lse = ranks[0].consumer.lse[:, :td, 0].cpu()
        seen["tokens"] += td
        seen["one rank only"] += int((torch.isinf(lse).sum(0) == world - 1).sum())
    assert all(seen.values()), seen


def test_gloo_ranks_merge_over_their_group(tmp_path):
    """Each rank a process: ``attend_into`` whole, the LSE all-gather and the output
    all-reduce over gloo, in two DCP groups of two ranks side by side, each with steps of
    its own (a collective over every process would mix them)."""
    target = functools.partial(world_of.rank_steps, world=2, interleave=1, seed=5, steps=3,
                               groups=2)
    dcp_workers.check_records(dcp_workers.spawn_ranks(target, tmp_path, 4))
