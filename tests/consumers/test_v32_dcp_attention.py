"""DeepSeek V3.2's whole sparse attention under decode context parallelism alone, the real
consumers chained as a model would: each rank's indexer (DeepGEMM's logits, emulated on CPU)
ranks the keys it holds and merges the ranks' local top-k; the merged rows go as they are
to each rank's mixed-batch sparse MLA (FlashMLA's sparse decode, emulated on CPU), whose
partial outputs merge by their log-sum-exps. Every token of drawn mixed steps, on every
rank: the top-k is the single GPU's (ties allowed) and the attention the per-token oracle's
over that top-k, read from the single GPU's caches. Every rank in one process (the two
all-gathers and the all-reduce played by copies and sums)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from helpers import indexer_dcp
from helpers import sparse_mla_dcp as attention_world
from helpers.dsa_reference import dequant_indexer_cache
from helpers.sparse_mla_reference import (
    UNTOUCHED,
    emulated_sparse_decode,
    kernel_abs_tol,
    oracle_attention,
    served_row_problems,
)
from helpers.sparse_mla_steps import DEVICES as ATTENTION_DEVICES
from helpers.sparse_mla_steps import tiled_cache

from staticattn.builders.swa.tile_scheduler import TileSchedulerMeta
from staticattn.consumers.real.sparse_mla_mixed import SparseMLAMixedBatch
from staticattn.consumers.real.sparse_mla_prefill import V32_SOFTMAX_SCALE

HEADS = 64
STEPS = 3
#: CPU: both kernels' torch emulations; CUDA: DeepGEMM's and FlashMLA's, both needed.
DEVICES = ["cpu", pytest.param("cuda", marks=[*indexer_dcp.DEVICES[1].marks,
                                              *ATTENTION_DEVICES[1].marks[2:]])]


@dataclasses.dataclass
class Rank:
    index: indexer_dcp.Rank
    attention: SparseMLAMixedBatch
    out: torch.Tensor


def _rank(world: int, p: int, interleave: int, device: str) -> Rank:
    index = indexer_dcp.make_rank(world, p, interleave, device)
    cfg, emulated = index.config, device == "cpu"
    q = torch.zeros(cfg.max_num_batched_tokens, HEADS, 576, dtype=torch.bfloat16,
                    device=device)
    attention = SparseMLAMixedBatch(
        cfg, kv_cache=tiled_cache(indexer_dcp.BLOCKS, device), q=q, topk=indexer_dcp.TOPK,
        decode_fn=emulated_sparse_decode if emulated else None,
        plan_fn=TileSchedulerMeta if emulated else None)
    out = torch.full((cfg.max_num_batched_tokens, HEADS, 512), UNTOUCHED, dtype=torch.bfloat16,
                     device=device)
    return Rank(index, attention, out)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("build", ["build", "build_mixed"])
@pytest.mark.parametrize("world,interleave", [(2, 1), (2, 64), (4, 16)])
def test_the_ranks_attend_as_the_single_gpu(world, interleave, build, device):
    ranks = [_rank(world, p, interleave, device) for p in range(world)]
    single_keys = indexer_dcp.single_cache(world + interleave)
    keys = dequant_indexer_cache(single_keys)
    single_kv = tiled_cache(indexer_dcp.BLOCKS, "cpu")
    rng = np.random.default_rng(world * 7 + interleave)
    for i in range(STEPS):
        g = indexer_dcp.draw_step(rng, keys, lens=indexer_dcp.OVERFLOW if i == 0 else None)
        t = g.q.shape[0]
        queries = torch.from_numpy(rng.standard_normal((t, HEADS, 576), dtype=np.float32)
                                   ).to(torch.bfloat16)
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
        topk = placed[0][1][:t].cpu().numpy()
        # The attention over the merged rows, as they are, of the batch the indexer read.
        for p, r in enumerate(ranks):
            a = r.attention
            a.kv_cache.zero_()
            for src_block, src_off, block, off in attention_world.owned_entries(
                    g.table, g.step.seq_lens, world, interleave, p):
                a.kv_cache[block, off] = single_kv[src_block, src_off].to(device)
            a.q[:t].copy_(queries.to(device))
            r.out.fill_(UNTOUCHED)
        batches = [r.index.batch for r in ranks]
        outs = [r.attention.attend_local(b, rows) for r, b, (_, rows)
                in zip(ranks, batches, placed)]
        attention_world.play_merge([r.attention for r in ranks], outs[0].shape[0])
        q_lens, seq = np.asarray(g.step.query_lens), np.asarray(g.step.seq_lens)
        ref = oracle_attention(queries, single_kv, g.table, q_lens, seq, topk,
                               V32_SOFTMAX_SCALE)
        tol = kernel_abs_tol(torch.device(device), single_kv, g.table, q_lens, seq, topk,
                             merged=True)
        served = torch.arange(ranks[0].out.shape[0]) < t
        for r, b, o in zip(ranks, batches, outs):
            r.attention.write(b, r.attention.partial[: o.shape[0]], r.out)
            assert served_row_problems(r.out.cpu(), ref, served, tol) == []
