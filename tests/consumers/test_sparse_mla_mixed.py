"""DeepSeek V3.2's sparse MLA over every token of a step as one batch of FlashMLA's sparse FP8
decode (the reference's mixed-batch mode; emulated on CPU, the real kernel on CUDA): on one
GPU and under decode context parallelism, where each rank attends over the top-k entries it
holds and the partial outputs merge by their log-sum-exps (every rank in one process, the
LSE all-gather and the output all-reduce played by copies and sums). Every token's row,
decode and prefill alike, is the per-token oracle's attention over its whole top-k; a token
bucket's rows past the step stay untouched."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from helpers import sparse_mla_dcp as world_of
from helpers.mixed_steps import stage_mixed
from helpers.pcp_dcp_ranks import unique_block_rows
from helpers.sparse_mla_reference import (
    UNTOUCHED,
    emulated_sparse_decode,
    kernel_abs_tol,
    served_row_problems,
)
from helpers.sparse_mla_steps import DEVICES, tiled_cache
from helpers.support import make_step, stage

from staticattn.builders import IndexerMetadataBuilder, make_arena
from staticattn.builders.swa.tile_scheduler import TileSchedulerMeta
from staticattn.consumers.real.sparse_mla_mixed import SparseMLAMixedBatch
from staticattn.errors import InvalidBatchError

#: (world, interleave).
WORLDS = [(1, 1), (2, 1), (2, 64), (4, 1)]
STEPS = 3
COLS = world_of.MAX_LEN // world_of.PAGE


@dataclasses.dataclass
class Rank:
    config: object
    inputs: object
    consumer: SparseMLAMixedBatch
    out: torch.Tensor


def _rank(world: int, p: int, interleave: int, device: str) -> Rank:
    cfg = world_of.config(world, p, interleave, device)
    _, inputs = make_arena(cfg, [IndexerMetadataBuilder()])
    q = torch.zeros(cfg.max_num_batched_tokens, world_of.HEADS, 576, dtype=torch.bfloat16,
                    device=device)
    emulated = device == "cpu"
    consumer = SparseMLAMixedBatch(
        cfg, kv_cache=tiled_cache(world_of.BLOCKS, device), q=q, topk=world_of.TOPK,
        decode_fn=emulated_sparse_decode if emulated else None,
        plan_fn=TileSchedulerMeta if emulated else None)
    out = torch.full((cfg.max_num_batched_tokens, world_of.HEADS, 512), UNTOUCHED,
                     dtype=torch.bfloat16, device=device)
    return Rank(cfg, inputs, consumer, out)


def _draw(rng: np.random.Generator) -> tuple[list[int], list[int], np.ndarray]:
    """Decodes, then prefills (fresh, continued, some long) within the token budget; unique
    block rows int32 ``(S, COLS)``."""
    s = int(rng.integers(1, world_of.SEQS + 1))
    decodes = int(rng.integers(0, s))
    q = [1] * decodes
    budget = 64 - decodes
    for i in range(s - decodes):
        q.append(int(rng.integers(2, max(3, budget // (s - decodes - i)))))
        budget -= q[-1]
    seq = [n if rng.random() < 0.3 else int(rng.integers(n, world_of.MAX_LEN + 1)) for n in q]
    return q, seq, unique_block_rows(rng, s, COLS, world_of.SEQS)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("build", ["build", "build_mixed"])
@pytest.mark.parametrize("world,interleave", WORLDS)
def test_every_token_is_the_oracle_attention(world, interleave, build, device):
    ranks = [_rank(world, p, interleave, device) for p in range(world)]
    single = tiled_cache(world_of.BLOCKS, "cpu")
    rng = np.random.default_rng(world * 10 + interleave)
    prefill_tokens = 0
    for _ in range(STEPS):
        q_lens, seq, table = _draw(rng)
        queries, topk, ref = world_of.draw_inputs(rng, q_lens, seq, table, single)
        t = queries.shape[0]
        rows = torch.full((ranks[0].config.max_num_batched_tokens, world_of.TOPK), -1,
                          dtype=torch.int32)
        rows[:t] = torch.from_numpy(topk)
        batches = []
        for p, r in enumerate(ranks):
            r.consumer.kv_cache.zero_()
            for src_block, src_off, block, off in world_of.owned_entries(
                    table, seq, world, interleave, p):
                r.consumer.kv_cache[block, off] = single[src_block, src_off].to(device)
            r.consumer.q[:t].copy_(queries.to(device))
            r.out.fill_(UNTOUCHED)
            s = dataclasses.replace(make_step(r.config, q_lens, seq),
                                    block_table=table[:, : r.config.max_blocks_per_req])
            batches.append(stage(r.inputs, s) if build == "build" else stage_mixed(
                r.inputs, s, r.config.max_num_seqs, r.config.max_num_batched_tokens))
        outs = [r.consumer.attend_local(b, rows.to(device)) for r, b in zip(ranks, batches)]
        n = outs[0].shape[0]
        if world > 1:
            world_of.play_merge([r.consumer for r in ranks], n)
            outs = [r.consumer.partial[:n] for r in ranks]
        tol = kernel_abs_tol(torch.device(device), single, table, np.asarray(q_lens),
                             np.asarray(seq), topk, merged=world > 1)
        served = torch.arange(ranks[0].out.shape[0]) < t
        for r, b, o in zip(ranks, batches, outs):
            r.consumer.write(b, o, r.out)
            assert served_row_problems(r.out.cpu(), ref, served, tol) == [], \
                f"rank {r.config.dcp_rank}"
        prefill_tokens += sum(x for x in q_lens if x > 1)
    assert prefill_tokens


def test_a_batch_without_positions_is_refused_before_anything_is_written():
    r = _rank(1, 0, 1, "cpu")
    s = dataclasses.replace(make_step(r.config, [1, 5], [40, 9]),
                            block_table=np.arange(1, 1 + 2 * COLS, dtype=np.int32)
                            .reshape(2, COLS)[:, : r.config.max_blocks_per_req])
    batch = dataclasses.replace(stage(r.inputs, s), positions=None)
    rows = torch.full((r.config.max_num_batched_tokens, world_of.TOPK), -1, dtype=torch.int32)
    with pytest.raises(InvalidBatchError, match="position"):
        r.consumer.attend_into(batch, rows, r.out)
    assert (r.out == UNTOUCHED).all()
