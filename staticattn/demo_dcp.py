"""The decode-context-parallel demo: one process per rank, started by torchrun.

    torchrun --nproc-per-node 2 -m staticattn demo --dcp 2 [--steps 500]
             [--dcp-preset deepseek-v4 | deepseek-v3.2]

Each rank builds its own arena (``dcp_rank`` = the launcher's rank), the indexer builder and
the reference DCP consumer (:mod:`staticattn.consumers.dcp_decode`); on GPUs it captures one
graph per decode size holding the staging, the rank's build and the consumer with its NCCL
all-gathers (without CUDA: gloo, every step eager). Every rank draws the same random decode
steps (one seed), writes its share of each request's keys, checks the step against the group
(:func:`~staticattn.builders.dcp_check.check_dcp_step`, over gloo) and runs it. Each rank
also runs the step on a one-rank arena holding every key (the single-GPU step) and compares:
the top-k exactly, the merged output within float32 rounding (``rtol 1e-4, atol 1e-5``).
Rank 0 prints the totals and the host time per step of every rank (p50, p99).
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from staticattn.arena import ArenaConfig, cdiv
from staticattn.builders import make_arena
from staticattn.builders.dcp_check import check_dcp_step
from staticattn.builders.indexer import IndexerMetadataBuilder
from staticattn.consumers.dcp_decode import DCPDecodeAttention
from staticattn.graphs import GraphManager

__all__ = ["dcp_config", "dcp_world", "random_decode_step", "run_dcp_demo", "write_decode_step"]

#: The consumer's shapes: top-k, indexer heads and width, attention heads and width.
TOPK, INDEX_HEADS, INDEX_DIM, HEADS, HEAD_DIM = 64, 4, 16, 4, 16


def dcp_config(preset: str, world: int, rank: int, device: str) -> ArenaConfig:
    """The preset's arena, small enough for a demo: 16 requests, 16K context; V4: next_n 2,
    R = 4, interleave 4; V3.2: next_n 1, R = 1, interleave 1."""
    interleave = 4 if preset == "deepseek-v4" else 1
    return ArenaConfig.preset(
        preset, max_num_seqs=16, max_num_batched_tokens=64, max_model_len=16384,
        dcp_world_size=world, dcp_rank=rank, cp_kv_cache_interleave_size=interleave,
        device=device)


def dcp_world(cfg: ArenaConfig, group) -> tuple:
    """``(arena, inputs, builder, consumer)`` of one config: its arena, the indexer builder
    and the DCP consumer over caches for ``max_num_seqs`` requests of unique blocks."""
    builder = IndexerMetadataBuilder()
    arena, inputs = make_arena(cfg, [builder])
    blocks = cfg.max_num_seqs * cdiv(cfg.max_model_len, cfg.block_size) + 1
    consumer = DCPDecodeAttention(
        cfg, group, num_slots=blocks * (cfg.block_size // cfg.index_compress_ratio),
        topk=TOPK, index_heads=INDEX_HEADS, index_dim=INDEX_DIM, heads=HEADS,
        head_dim=HEAD_DIM)
    return arena, inputs, builder, consumer


def random_decode_step(cfg: ArenaConfig, rng: np.random.Generator) -> dict:
    """A uniform decode step of ``k`` random requests (``next_n`` tokens each) and what the
    DCP consumer reads: ``query_lens``, ``seq_lens`` host ints ``(k,)``, ``slot_mapping``
    host ints ``(k * next_n,)``; ``table`` int32 ``(k, blocks)``, unique block-table rows
    with as many columns as one GPU needs (a rank uses the first); per request ``keys``
    float32 ``(entries, INDEX_DIM)`` and ``kv`` float32 ``(entries, 2, HEAD_DIM)``, its
    global compressed entries; per token ``q`` float32 ``(k * next_n, INDEX_HEADS,
    INDEX_DIM)``, ``weights`` float32 ``(k * next_n, INDEX_HEADS)``, ``q_att`` float32
    ``(k * next_n, HEADS, HEAD_DIM)``."""
    n, ratio = cfg.next_n, cfg.index_compress_ratio
    k = int(rng.integers(1, cfg.max_num_seqs + 1))
    seq = rng.integers(n, cfg.max_model_len + 1, size=k)
    columns = cdiv(cfg.max_model_len, cfg.block_size)
    pos = np.concatenate([np.arange(L - n, L) for L in seq])
    return dict(
        query_lens=np.full(k, n), seq_lens=seq, slot_mapping=pos,
        table=torch.from_numpy(1 + np.arange(k * columns, dtype=np.int32).reshape(k, -1)),
        keys=[torch.from_numpy(rng.standard_normal((int(L) // ratio, INDEX_DIM), np.float32))
              for L in seq],
        kv=[torch.from_numpy(rng.standard_normal((int(L) // ratio, 2, HEAD_DIM), np.float32))
            for L in seq],
        q=torch.from_numpy(rng.standard_normal((k * n, INDEX_HEADS, INDEX_DIM), np.float32)),
        weights=torch.from_numpy(rng.random((k * n, INDEX_HEADS), np.float32)),
        q_att=torch.from_numpy(rng.standard_normal((k * n, HEADS, HEAD_DIM), np.float32)),
    )


def write_decode_step(inputs, consumer: DCPDecodeAttention, step: dict) -> None:
    """What the engine has done before a :func:`random_decode_step`: the block-table rows
    (cut to this arena's columns), the rank's share of the caches, the queries."""
    table = step["table"][:, : inputs.block_table.shape[1]]
    inputs.block_table[: table.shape[0]].copy_(table)
    for b, (keys, kv) in enumerate(zip(step["keys"], step["kv"])):
        consumer.write_keys(table[b], keys, kv)
    t = step["q"].shape[0]
    for name in ("q", "weights", "q_att"):
        getattr(consumer, name)[:t].copy_(step[name])


def run_dcp_demo(world: int, steps: int = 200, seed: int = 0,
                 preset: str = "deepseek-v4") -> int:
    """Run the demo on this rank of a torchrun launch of ``world`` ranks, with a small arena
    of ``preset`` ("deepseek-v4" or "deepseek-v3.2"); the exit status (0 when every step
    matched the single-GPU step on every rank)."""
    if int(os.environ.get("WORLD_SIZE", "1")) != world:
        print(f"demo --dcp {world}: start it with torchrun --nproc-per-node {world} "
              f"-m staticattn demo --dcp {world} (WORLD_SIZE is "
              f"{os.environ.get('WORLD_SIZE', 'unset')})")
        return 2
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    # The step check exchanges host values: over gloo beside NCCL (dcp_check says why).
    check_group = dist.new_group(backend="gloo") if cuda else dist.group.WORLD
    device = f"cuda:{torch.cuda.current_device()}" if cuda else "cpu"
    cfg = dcp_config(preset, world, rank, device)
    arena, inputs, builder, consumer = dcp_world(cfg, dist.group.WORLD)
    single = dcp_world(dcp_config(preset, 1, 0, device), None)
    rng = np.random.default_rng(seed)
    host_us, mismatches, replays = [], 0, 0
    with GraphManager(arena, inputs, [builder], consumer, progress=False) as gm, \
            GraphManager(*single[:2], [single[2]], single[3], progress=False) as one:
        if cuda:
            gm.capture(buckets=())  # every rank captures the same sizes, in one order
        for _ in range(steps):
            step = random_decode_step(cfg, rng)
            write_decode_step(inputs, consumer, step)
            write_decode_step(single[1], single[3], step)
            lengths = (step["query_lens"], step["seq_lens"], step["slot_mapping"])
            check_dcp_step(cfg, lengths[0], lengths[1], group=check_group,
                           timeout=timedelta(seconds=60))
            t0 = time.perf_counter()
            res = gm.run(*lengths)
            host_us.append((time.perf_counter() - t0) * 1e6)
            replays += res.mode == "graph"
            ids, out = (x.clone() for x in res.outputs)
            want_ids, want = one.run(*lengths, eager=True).outputs
            mismatches += not (torch.equal(ids, want_ids)
                               and torch.allclose(out, want, rtol=1e-4, atol=1e-5))
    totals = [None] * world
    dist.all_gather_object(totals, (mismatches, replays, np.percentile(host_us, [50, 99])),
                           group=check_group)
    if rank == 0:
        mode = "graphs (NCCL)" if cuda else "eager (gloo, no CUDA)"
        print(f"DCP demo ({preset}, next_n {cfg.next_n}): {world} ranks, {steps} decode "
              f"steps each, {mode}")
        for r, (bad, replayed, (p50, p99)) in enumerate(totals):
            print(f"rank {r}: replayed {replayed}/{steps}, host us per step p50 {p50:.0f} "
                  f"p99 {p99:.0f}, mismatches against the single-GPU step {bad}")
        print(f"mismatches {sum(t[0] for t in totals)}")
    dist.destroy_process_group()
    return 0 if all(t[0] == 0 for t in totals) else 1
