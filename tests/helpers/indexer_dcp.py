"""The setting of the real indexer's tests under decode context parallelism alone
(``consumers/test_indexer_dcp.py``): each rank's arena, builder and
:class:`~staticattn.consumers.real.indexer_topk.IndexerTopKStep` (its cache the rank's share
of the single GPU's keys, placed by the spec's ownership rule through
:func:`helpers.pcp_dcp_indexer.shard`); global steps whose block rows are unique, so that
every rank's share is written through the same rows; the single-GPU oracle's logits; and
the rank worker of the gloo test."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist

from helpers import sparse_mla_dcp
from helpers.dcp_workers import join_group
from helpers.dsa_reference import (
    check_topk,
    decode_token_table,
    dequant_indexer_cache,
    emulated_mqa_logits,
    emulated_paged_mqa_logits,
    ref_indexer_logits,
)
from helpers.mixed_steps import stage_mixed
from helpers.pcp_dcp_indexer import shard
from helpers.pcp_dcp_ranks import unique_block_rows
from helpers.support import make_step, stage
from staticattn.arena import ArenaConfig
from staticattn.builders import IndexerMetadataBuilder, make_arena
from staticattn.consumers.real.caches import INDEXER_BLOCK, alloc_indexer_cache, write_indexer_cache
from staticattn.consumers.real.indexer_topk import IndexerTopKStep
from staticattn.kernels.runtime.dsa_libs import DEEP_GEMM, import_error

HEADS, HEAD_DIM, TOPK = 32, 32, 64
MAX_LEN, SEQS, TOKENS = 512, 4, 96
#: Fewer keys than a step's prefills hold: their chunks split.
WORKSPACE = 600
COLS = MAX_LEN // INDEXER_BLOCK
#: One page per (request, column) of the single GPU's table, and the null block 0.
BLOCKS = 1 + SEQS * COLS

#: CPU: DeepGEMM's torch emulations; CUDA: its sm90 kernels.
DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(bool(import_error(DEEP_GEMM)), reason=str(import_error(DEEP_GEMM)))])]


def config(world: int, rank: int, interleave: int, device: str, spec: int = 0) -> ArenaConfig:
    return sparse_mla_dcp.config(world, rank, interleave, device, spec, max_model_len=MAX_LEN,
                                 max_num_seqs=SEQS, max_num_batched_tokens=TOKENS,
                                 max_prefill_workspace=WORKSPACE, index_topk=TOPK)


@dataclasses.dataclass
class Rank:
    config: ArenaConfig
    builder: IndexerMetadataBuilder
    inputs: object
    step: IndexerTopKStep
    #: The batch :func:`place` staged last.
    batch: object = None


def make_rank(world: int, p: int, interleave: int, device: str, spec: int = 0,
              group=None) -> Rank:
    cfg = config(world, p, interleave, device, spec)
    builder = IndexerMetadataBuilder()
    _, inputs = make_arena(cfg, [builder])
    emulated = device == "cpu"
    step = IndexerTopKStep(cfg, num_kv_blocks=BLOCKS, num_heads=HEADS, head_dim=HEAD_DIM,
                           prefill=True, group=group,
                           logits_fn=emulated_paged_mqa_logits if emulated else None,
                           mqa_logits_fn=emulated_mqa_logits if emulated else None)
    return Rank(cfg, builder, inputs, step)


def single_cache(seed: int) -> torch.Tensor:
    """The single GPU's indexer cache (CPU), random keys."""
    cache = alloc_indexer_cache(BLOCKS, HEAD_DIM, "cpu")
    gen = torch.Generator().manual_seed(seed)
    write_indexer_cache(cache, torch.randn(BLOCKS, INDEXER_BLOCK, HEAD_DIM, generator=gen))
    return cache


@dataclasses.dataclass
class GlobalStep:
    """A drawn step as every rank sees it, with the single GPU's answer key."""

    step: object          # HostStep of the single GPU (its block rows ``table``)
    table: np.ndarray     # int32 (S, COLS) unique block rows
    q: torch.Tensor       # e4m3 (T, HEADS, HEAD_DIM)
    weights: torch.Tensor  # fp32 (T, HEADS)
    ref: torch.Tensor     # fp32 (T, MAX_LEN): the oracle's logits, -inf past each token
    tok_len: np.ndarray   # each token's key count


#: A step whose prefills' keys overflow the workspace: a decode, then two long prefills.
OVERFLOW = ([1, 40, 30], [300, 500, 450])


def draw_step(rng: np.random.Generator, keys: torch.Tensor, spec: int = 0,
              lens: tuple[list[int], list[int]] | None = None) -> GlobalStep:
    """Decodes (one token, or 1..1+spec MTP tokens), then prefills, fresh or continued,
    within the token budget; long, short (within one interleave group) and fresh lengths.
    ``lens``: the query and sequence lengths, drawn when None."""
    q_lens, seq = lens if lens is not None else _draw_lens(rng, spec)
    s = len(q_lens)
    table = unique_block_rows(rng, s, COLS, SEQS)
    cfg = config(1, 0, 1, "cpu", spec)
    step = dataclasses.replace(make_step(cfg, q_lens, seq, rng=rng, num_blocks=BLOCKS),
                               block_table=table)
    ql, sl = np.asarray(q_lens), np.asarray(seq)
    tok_req, _, tok_len = decode_token_table(ql, sl, 1)
    t = tok_req.shape[0]
    gen = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
    q = torch.randn(t, HEADS, HEAD_DIM, generator=gen).to(torch.float8_e4m3fn)
    weights = torch.randn(t, HEADS, generator=gen)
    ref = ref_indexer_logits(q, weights, keys, torch.from_numpy(table), tok_req, tok_len,
                             MAX_LEN)
    return GlobalStep(step, table, q, weights, ref, tok_len)


def _draw_lens(rng: np.random.Generator, spec: int) -> tuple[list[int], list[int]]:
    s = int(rng.integers(1, SEQS + 1))
    decodes = int(rng.integers(0, s + 1))
    q_lens = [int(rng.integers(1, spec + 2)) for _ in range(decodes)]
    budget = TOKENS - sum(q_lens)
    for i in range(s - decodes):
        left = s - decodes - i
        q_lens.append(int(rng.integers(1, max(2, budget // left))))
        budget -= q_lens[-1]
    seq = []
    for q in q_lens:
        kind = rng.choice(3, p=[0.6, 0.25, 0.15])
        seq.append(q if kind == 2 else int(rng.integers(q, MAX_LEN + 1) if kind == 0
                                           else rng.integers(q, min(MAX_LEN, q + 70) + 1)))
    return q_lens, seq


def place(rank: Rank, p: int, world: int, interleave: int, g: GlobalStep, single: torch.Tensor,
          build: str):
    """Rank ``p``'s share of the keys, the step's queries, the step staged and built
    (``"build"``: eagerly; ``"build_mixed"``: in the bucket of every request and token;
    the batch kept as ``rank.batch``); returns the metadata and the rank's output rows (a
    view of ``step.out``)."""
    st = rank.step
    st.kv_cache.copy_(shard(single, g.table, g.step.seq_lens, world, interleave, p)
                      .to(st.kv_cache.device))
    t = g.q.shape[0]
    st.q[:t].copy_(g.q.to(st.q.device))
    st.weights[:t].copy_(g.weights.to(st.weights.device))
    cfg = rank.config
    s = dataclasses.replace(g.step, block_table=g.table[:, : cfg.max_blocks_per_req])
    if build == "build":
        batch = stage(rank.inputs, s)
        md = rank.builder.build(batch)
    else:
        batch = stage_mixed(rank.inputs, s, cfg.max_num_seqs, cfg.max_num_batched_tokens)
        md = rank.builder.build_mixed(batch)
    rank.batch = batch
    return md, st.out[: batch.num_actual_tokens]


def problems(out: torch.Tensor, g: GlobalStep) -> list[str]:
    """A rank's rows against the single GPU's top-k (ties allowed), -1 past the step."""
    t = g.q.shape[0]
    found = check_topk(out[:t].cpu(), g.ref, g.tok_len)
    if (out[t:] != -1).any():
        found.append("a row past the step's tokens holds a key")
    return found


def rank_steps(rank: int, out: str, world: int, interleave: int, seed: int, steps: int,
               groups: int = 1, device: str = "cpu") -> None:
    """A rank's process for ``dcp_workers.spawn_ranks`` (``groups * world`` processes; gloo
    on CPU, NCCL on CUDA): ``groups`` DCP groups of ``world`` ranks side by side, each
    drawing steps of its own (``seed`` plus its index), so that a merge over the wrong group
    mixes steps that differ; per step the whole step (its merge over its group), eagerly
    and from a token bucket's build; records each step's problems and whether every rank of
    its group holds the same rows."""
    device = join_group(rank, out, world * groups, device)
    subgroups = [dist.new_group(list(range(g * world, (g + 1) * world))) for g in range(groups)]
    mine, p = divmod(rank, world)
    me = make_rank(world, p, interleave, device, group=subgroups[mine])
    single = single_cache(seed + mine)
    keys = dequant_indexer_cache(single)
    rng = np.random.default_rng(seed + mine)
    record = {"problems": [], "tokens": 0, "differs": 0}
    for i in range(steps):
        g = draw_step(rng, keys)
        md, rows = place(me, p, world, interleave, g, single, ("build", "build_mixed")[i % 2])
        me.step.topk_into(md, rows)
        record["problems"] += problems(rows, g)
        others = [torch.empty_like(rows) for _ in range(world)]
        dist.all_gather(others, rows.contiguous(), group=subgroups[mine])
        record["differs"] += sum(not torch.equal(o, rows) for o in others)
        record["tokens"] += g.q.shape[0]
    dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
