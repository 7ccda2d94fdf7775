"""The real indexer (DeepGEMM's paged and prefill MQA logits; their torch emulations on CPU)
under decode context parallelism alone (``vllm-0.33-extras.md`` §7.1): each rank ranks the
keys it holds -- its decode tokens' and, chunk by chunk, its prefill tokens' -- and the
ranks' local top-k merge into the global one. Every token's row, on every rank, is the
single-GPU oracle's top-k (ties allowed), whichever build made the metadata (the eager
build's host chunks, split where the keys overflow the workspace, or a token bucket's
device plan), including MTP decode rows and tokens whose keys all lie on one rank. Every
rank in one process (the merge's all-gather played by copies), and gloo ranks running the
step whole in two DCP groups side by side."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from helpers import dcp_workers
from helpers import indexer_dcp as world_of
from helpers.dsa_reference import dequant_indexer_cache

#: (world, interleave, speculative tokens, build).
CASES = [(2, 1, 0, "build"), (2, 64, 0, "build"), (4, 1, 0, "build"),
         (2, 1, 0, "build_mixed"), (2, 64, 1, "build_mixed"), (4, 16, 0, "build_mixed")]
STEPS = 4


@pytest.mark.parametrize("device", world_of.DEVICES)
@pytest.mark.parametrize("world,interleave,spec,build", CASES)
def test_every_rank_holds_the_single_gpu_topk(world, interleave, spec, build, device):
    ranks = [world_of.make_rank(world, p, interleave, device, spec) for p in range(world)]
    single = world_of.single_cache(world + interleave)
    keys = dequant_indexer_cache(single)
    rng = np.random.default_rng(world * 100 + interleave + spec)
    seen = {"decode tokens": 0, "prefill tokens past the top-k": 0, "split chunks": 0}
    for i in range(STEPS):
        g = world_of.draw_step(rng, keys, spec, world_of.OVERFLOW if i == 0 else None)
        placed = [world_of.place(r, p, world, interleave, g, single, build)
                  for p, r in enumerate(ranks)]
        n = {r.step.local_topk_into(md, out) for r, (md, out) in zip(ranks, placed)}
        assert len(n) == 1 and n.pop() == placed[0][1].shape[0]
        rows = placed[0][1].shape[0]
        for r in ranks:  # the merge's all-gather
            for d, other in enumerate(ranks):
                r.step.merge.candidates(rows)[d].copy_(other.step.merge.candidates(rows)[d])
        for r, (_, out) in zip(ranks, placed):
            r.step.merged_into(out, rows)
            assert world_of.problems(out, g) == [], f"rank {r.config.dcp_rank}"
            assert torch.equal(out.cpu(), placed[0][1].cpu())
        md = placed[0][0]
        q_lens = np.asarray(g.step.query_lens)
        seen["decode tokens"] += int(q_lens[q_lens <= spec + 1].sum())
        seen["prefill tokens past the top-k"] += int(
            (g.tok_len[np.repeat(q_lens > spec + 1, q_lens)] > world_of.TOPK).sum())
        if md.prefill is not None and md.prefill.plan is None:
            seen["split chunks"] += len({c.req_start for c in md.prefill.chunks}) > 1
        elif md.prefill is not None:
            seen["split chunks"] += int(md.prefill.plan.num_chunks) > 1
    assert all(seen.values()), seen


def test_without_the_merge_a_rank_holds_local_indices():
    """The merge is what makes the rows global: a rank's local top-k alone is not the
    single GPU's (its indices count the keys it holds)."""
    ranks = [world_of.make_rank(2, p, 1, "cpu") for p in range(2)]
    single = world_of.single_cache(3)
    keys = dequant_indexer_cache(single)
    g = world_of.draw_step(np.random.default_rng(3), keys)
    md, out = world_of.place(ranks[1], 1, 2, 1, g, single, "build")
    ranks[1].step.local_topk_into(md, out)
    assert world_of.problems(out, g) != []


def test_gloo_ranks_merge_over_their_group(tmp_path):
    """Each rank a process running the step whole (the merge's all-gather over gloo), in
    two DCP groups of two ranks, each with steps of its own."""
    target = functools.partial(world_of.rank_steps, world=2, interleave=1, seed=7, steps=4,
                               groups=2)
    records = dcp_workers.spawn_ranks(target, tmp_path, 4)
    dcp_workers.check_records(records)
    assert not any(r["differs"] for r in records), "the ranks of a group hold different rows"
