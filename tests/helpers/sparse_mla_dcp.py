"""The setting of the sparse-MLA decode tests under decode context parallelism
(``consumers/test_sparse_mla_decode_dcp.py``): each rank's arena, its share of the
``fp8_ds_mla`` cache (placed by the spec's ownership rule, written here independently of the
package) and its consumer; drawn decode steps whose block rows are unique, so that every
rank's share can be written through the same rows; the check of the merged rows against the
single-GPU oracle; and the rank worker of the gloo test."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import torch
import torch.distributed as dist

from helpers.dcp_workers import join_group
from helpers.mixed_steps import stage_mixed
from helpers.pcp_dcp_ranks import PAGE, owned_entries, unique_block_rows
from helpers.sparse_mla_reference import (
    UNTOUCHED,
    emulated_sparse_decode,
    kernel_abs_tol,
    oracle_attention,
    served_row_problems,
)
from helpers.sparse_mla_steps import new_inputs, tiled_cache
from helpers.support import make_step, stage
from staticattn.arena import ArenaConfig
from staticattn.builders import IndexerMetadataBuilder, make_arena
from staticattn.builders.swa.tile_scheduler import TileSchedulerMeta
from staticattn.consumers.real.sparse_mla_decode import SparseMLADecode
from staticattn.consumers.real.sparse_mla_prefill import V32_SOFTMAX_SCALE

HEADS, TOPK = 64, 128
MAX_LEN, SEQS = 1024, 8
#: One page per (request, column) of the single GPU's table, and the null block 0.
BLOCKS = 1 + SEQS * MAX_LEN // PAGE


def config(world: int, rank: int, interleave: int, device: str, spec: int = 0,
           **sizes) -> ArenaConfig:
    """DCP rank ``rank`` of ``world`` of a small V3.2 (``sizes``: capacities that differ from
    this setting's)."""
    return ArenaConfig.deepseek_v32(**{
        **dict(max_model_len=MAX_LEN, max_num_seqs=SEQS, max_num_batched_tokens=64,
               max_prefill_workspace=1100, max_logits_bytes=120_000, index_topk=TOPK),
        **sizes, "num_speculative_tokens": spec, "dcp_world_size": world, "dcp_rank": rank,
        "cp_kv_cache_interleave_size": interleave, "device": device,
        "kernel_backend": "torch" if device == "cpu" else "auto"})


@dataclasses.dataclass
class Rank:
    config: ArenaConfig
    builder: IndexerMetadataBuilder
    inputs: object
    cache: torch.Tensor
    consumer: SparseMLADecode
    out: torch.Tensor


def make_rank(world: int, rank: int, interleave: int, device: str, spec: int = 0,
              group=None) -> Rank:
    cfg = config(world, rank, interleave, device, spec)
    builder = IndexerMetadataBuilder()
    _, inputs = make_arena(cfg, [builder])
    cache = tiled_cache(BLOCKS, device)
    q = torch.zeros(cfg.max_num_batched_tokens, HEADS, 576, dtype=torch.bfloat16,
                    device=device)
    emulated = device == "cpu"
    consumer = SparseMLADecode(cfg, kv_cache=cache, q=q, topk=TOPK, group=group,
                               decode_fn=emulated_sparse_decode if emulated else None,
                               plan_fn=TileSchedulerMeta if emulated else None)
    out = torch.full((cfg.max_num_batched_tokens, HEADS, 512), UNTOUCHED,
                     dtype=torch.bfloat16, device=device)
    return Rank(cfg, builder, inputs, cache, consumer, out)


def play_merge(consumers, t: int) -> None:
    """The DCP merge of the consumers' first ``t`` attended rows, every rank in this
    process: the LSE all-gather by copies, each rank's weighing, the all-reduce by a sum;
    after it each consumer's ``partial[:t]`` holds the merged rows."""
    for c in consumers:
        for d, other in enumerate(consumers):
            c.lse[d].copy_(other.lse[d])
    for c in consumers:
        c.weigh(t)
    total = sum(c.partial.clone() for c in consumers)
    for c in consumers:
        c.partial.copy_(total)


def draw_step(rng: np.random.Generator, spec: int) -> tuple[list[int], list[int], np.ndarray]:
    """A decode step (rows of 1..1+spec tokens: MTP's verified drafts and shorter rows)
    of 1..8 requests, lengths long, short and of the query alone, and its unique block rows
    int32 ``(S, MAX_LEN // PAGE)``."""
    s = int(rng.integers(1, SEQS + 1))
    width = 1 + spec
    q = [width] * s if rng.random() < 0.5 else [int(x) for x in rng.integers(1, width + 1, s)]
    # Long, short (within an interleave group: every key on one rank) and just the query.
    seq = [int(rng.choice([rng.integers(n, MAX_LEN + 1), rng.integers(n, n + 70), n],
                          p=[0.6, 0.25, 0.15])) for n in q]
    cols = MAX_LEN // PAGE
    table = unique_block_rows(rng, s, cols, SEQS)
    return q, seq, table


def place(rank: Rank, p: int, world: int, interleave: int, q_lens, seq, table: np.ndarray,
          single: torch.Tensor, queries: torch.Tensor, topk: np.ndarray, build: str = "build"):
    """Rank ``p``'s share of the single GPU's keys, its queries (``queries``: the step's,
    bf16 ``(T, H, 576)``), the step staged and built (``"build"``: eagerly;
    ``"build_mixed"``: in the bucket of every request and token): returns its indexer
    metadata and the top-k rows (int32 ``(T, K)``, -1 past the step, on the rank's
    device)."""
    rank.cache.zero_()
    for src_block, src_off, block, off in owned_entries(table, seq, world, interleave, p):
        rank.cache[block, off] = single[src_block, src_off].to(rank.cache.device)
    t = queries.shape[0]
    rank.consumer.q[:t].copy_(queries.to(rank.cache.device))
    cfg = rank.config
    step = make_step(cfg, q_lens, seq)
    step = dataclasses.replace(step, block_table=table[:, : cfg.max_blocks_per_req])
    rank.out.fill_(UNTOUCHED)
    if build == "build":
        md = rank.builder.build(stage(rank.inputs, step))
    else:
        md = rank.builder.build_mixed(stage_mixed(rank.inputs, step, cfg.max_num_seqs,
                                                  cfg.max_num_batched_tokens))
    rows = torch.full((cfg.max_num_batched_tokens, TOPK), -1, dtype=torch.int32)
    rows[:t] = torch.from_numpy(topk)
    return md, rows.to(rank.cache.device)


def draw_inputs(rng: np.random.Generator, q_lens, seq, table: np.ndarray,
                single: torch.Tensor) -> tuple[torch.Tensor, np.ndarray, torch.Tensor]:
    """The step's queries (bf16 ``(T, H, 576)``, CPU), top-k rows and the oracle's
    attention (fp32 ``(T, H, 512)``)."""
    queries = torch.zeros(int(sum(q_lens)), HEADS, 576, dtype=torch.bfloat16)
    topk = new_inputs(queries, make_step(config(1, 0, 1, "cpu"), q_lens, seq), TOPK,
                      int(rng.integers(1 << 30)))
    ref = oracle_attention(queries, single, table, np.asarray(q_lens), np.asarray(seq), topk,
                           V32_SOFTMAX_SCALE)
    return queries, topk, ref


def decode_tokens(md) -> int:
    """The step's decode tokens in indexer metadata ``md``: the eager build's count, or a
    mixed build's real ones (``step_counts[3]``; its layout spans the bucket's capacity)."""
    if md.step_counts is not None:
        return int(md.step_counts[3])
    return md.num_decode_tokens


def problems(rank: Rank, t: int, ref: torch.Tensor, single: torch.Tensor, table, q_lens, seq,
             topk: np.ndarray) -> list[str]:
    """The rank's merged rows of the first ``t`` tokens, the step's decode tokens (the
    eager build's: with MTP rows of unequal lengths, those of its uniform leading rows),
    against the oracle; the rows past them untouched."""
    tol = kernel_abs_tol(rank.out.device, single, table, np.asarray(q_lens), np.asarray(seq),
                         topk, merged=True)
    served = torch.arange(rank.out.shape[0]) < t
    return served_row_problems(rank.out.cpu(), ref[:t], served, tol[:t])


def rank_steps(rank: int, out: str, world: int, interleave: int, seed: int, steps: int,
               groups: int = 1, device: str = "cpu") -> None:
    """A rank's process for ``dcp_workers.spawn_ranks`` (``groups * world`` processes; gloo
    on CPU, NCCL on CUDA): ``groups`` DCP groups of ``world`` ranks side by side, each
    drawing steps of its own (``seed`` plus its index), so that a collective over the wrong
    group mixes steps that differ; per step the whole consumer (its LSE all-gather and
    output all-reduce over its group); records each step's problems."""
    device = join_group(rank, out, world * groups, device)
    subgroups = [dist.new_group(list(range(g * world, (g + 1) * world))) for g in range(groups)]
    mine, p = divmod(rank, world)
    me = make_rank(world, p, interleave, device, group=subgroups[mine])
    single = tiled_cache(BLOCKS, "cpu")
    rng = np.random.default_rng(seed + mine)
    record = {"problems": [], "tokens": 0}
    for _ in range(steps):
        q_lens, seq, table = draw_step(rng, 0)
        queries, topk, ref = draw_inputs(rng, q_lens, seq, table, single)
        md, rows = place(me, p, world, interleave, q_lens, seq, table, single, queries, topk)
        me.consumer.attend_into(md, rows, me.out)
        record["problems"] += problems(me, decode_tokens(md), ref, single, table, q_lens, seq,
                                       topk)
        record["tokens"] += int(sum(q_lens))
    dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
