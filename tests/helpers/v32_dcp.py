"""The setting of DeepSeek V3.2's whole sparse attention under DCP alone
(``consumers/test_v32_dcp_attention.py``): a rank's real indexer (:mod:`helpers.indexer_dcp`)
and mixed-batch sparse MLA over its share of the single GPU's ``fp8_ds_mla`` keys, a step's
attention placed and checked against the oracle, and the rank worker of the gloo test."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import torch
import torch.distributed as dist

from helpers import indexer_dcp
from helpers.dcp_workers import join_group
from helpers.dsa_reference import dequant_indexer_cache
from helpers.pcp_dcp_ranks import owned_entries
from helpers.sparse_mla_reference import (
    UNTOUCHED,
    emulated_sparse_decode,
    kernel_abs_tol,
    oracle_attention,
    served_row_problems,
)
from helpers.sparse_mla_steps import tiled_cache
from staticattn.builders.swa.tile_scheduler import TileSchedulerMeta
from staticattn.consumers.real.sparse_mla_mixed import SparseMLAMixedBatch
from staticattn.consumers.real.sparse_mla_prefill import V32_SOFTMAX_SCALE

HEADS = 64


@dataclasses.dataclass
class Rank:
    index: indexer_dcp.Rank
    attention: SparseMLAMixedBatch
    out: torch.Tensor


def make_rank(world: int, p: int, interleave: int, device: str, group=None) -> Rank:
    index = indexer_dcp.make_rank(world, p, interleave, device, group=group)
    cfg, emulated = index.config, device == "cpu"
    q = torch.zeros(cfg.max_num_batched_tokens, HEADS, 576, dtype=torch.bfloat16,
                    device=device)
    attention = SparseMLAMixedBatch(
        cfg, kv_cache=tiled_cache(indexer_dcp.BLOCKS, device), q=q, topk=indexer_dcp.TOPK,
        group=group, decode_fn=emulated_sparse_decode if emulated else None,
        plan_fn=TileSchedulerMeta if emulated else None)
    out = torch.full((cfg.max_num_batched_tokens, HEADS, 512), UNTOUCHED, dtype=torch.bfloat16,
                     device=device)
    return Rank(index, attention, out)


def draw_queries(rng: np.random.Generator, tokens: int) -> torch.Tensor:
    """The attention's queries of a step, bf16 ``(tokens, HEADS, 576)``, CPU."""
    return torch.from_numpy(rng.standard_normal((tokens, HEADS, 576), dtype=np.float32)
                            ).to(torch.bfloat16)


def place_attention(rank: Rank, p: int, world: int, interleave: int, g, single_kv: torch.Tensor,
                    queries: torch.Tensor) -> None:
    """Rank ``p``'s share of the single GPU's ``fp8_ds_mla`` keys and the step's queries;
    its output rows reset to :data:`UNTOUCHED`."""
    a, t = rank.attention, queries.shape[0]
    a.kv_cache.zero_()
    for src_block, src_off, block, off in owned_entries(g.table, g.step.seq_lens, world,
                                                        interleave, p):
        a.kv_cache[block, off] = single_kv[src_block, src_off].to(a.kv_cache.device)
    a.q[:t].copy_(queries.to(a.q.device))
    rank.out.fill_(UNTOUCHED)


def attention_problems(rank: Rank, g, queries: torch.Tensor, topk: np.ndarray,
                       single_kv: torch.Tensor) -> list[str]:
    """The rank's output rows against the oracle's attention over ``topk`` (the step's
    merged rows, int ``(T, K)``), read from the single GPU's cache; rows past the step
    untouched."""
    q_lens, seq = np.asarray(g.step.query_lens), np.asarray(g.step.seq_lens)
    ref = oracle_attention(queries, single_kv, g.table, q_lens, seq, topk, V32_SOFTMAX_SCALE)
    tol = kernel_abs_tol(rank.out.device, single_kv, g.table, q_lens, seq, topk, merged=True)
    served = torch.arange(rank.out.shape[0]) < queries.shape[0]
    return served_row_problems(rank.out.cpu(), ref, served, tol)


def rank_steps(rank: int, out: str, world: int, interleave: int, seed: int, steps: int,
               groups: int = 1, device: str = "cpu") -> None:
    """A rank's process for ``dcp_workers.spawn_ranks`` (``groups * world`` processes; gloo
    on CPU, NCCL on CUDA): ``groups`` DCP groups of ``world`` ranks side by side, each with
    steps of its own, so that a collective over the wrong group mixes steps that differ; per
    step the indexer whole (its merge over the group), then the attention whole over its
    rows (its LSE merge over the group), eagerly and from a token bucket's build; records
    each step's problems."""
    device = join_group(rank, out, world * groups, device)
    subgroups = [dist.new_group(list(range(g * world, (g + 1) * world))) for g in range(groups)]
    mine, p = divmod(rank, world)
    me = make_rank(world, p, interleave, device, group=subgroups[mine])
    single_keys = indexer_dcp.single_cache(seed + mine)
    keys = dequant_indexer_cache(single_keys)
    single_kv = tiled_cache(indexer_dcp.BLOCKS, "cpu")
    rng = np.random.default_rng(seed + mine)
    record = {"problems": [], "tokens": 0}
    for i in range(steps):
        g = indexer_dcp.draw_step(rng, keys)
        queries = draw_queries(rng, g.q.shape[0])
        md, rows = indexer_dcp.place(me.index, p, world, interleave, g, single_keys,
                                     ("build", "build_mixed")[i % 2])
        me.index.step.topk_into(md, rows)
        record["problems"] += indexer_dcp.problems(rows, g)
        place_attention(me, p, world, interleave, g, single_kv, queries)
        me.attention.attend_into(me.index.batch, rows, me.out)
        topk = rows[: queries.shape[0]].cpu().numpy()
        record["problems"] += attention_problems(me, g, queries, topk, single_kv)
        record["tokens"] += queries.shape[0]
    dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
