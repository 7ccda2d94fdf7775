"""What every rank of a decode-context-parallel run sets up: the process group, its arena,
the indexer builder and the reference DCP consumer, and random decode steps with the keys
and queries the consumer reads (the same on every rank: one seed)."""

from __future__ import annotations

import gc
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn

import numpy as np
import torch
import torch.distributed as dist

from staticattn.arena import ArenaConfig, cdiv
from staticattn.builders import make_arena
from staticattn.builders.indexer.builder import IndexerMetadataBuilder
from staticattn.consumers.dcp.dcp_decode import DCPDecodeAttention
from staticattn.errors import RankFailureError
from staticattn.validation.dcp_step import DEFAULT_DEADLINE, StepVerdicts

__all__ = ["Rank", "abandon", "dcp_config", "dcp_world", "graph_pool_blocks", "join",
           "kv_pool_blocks", "leave", "random_decode_step", "write_decode_step"]


@dataclass(frozen=True)
class Rank:
    """This process's place in a torchrun launch: ``rank``, ``world``, ``cuda`` (NCCL on
    the local GPU, else gloo on CPU), ``device``, ``check_group`` (gloo: the host-side
    step check and result exchange; None, the default group, on CPU, where that is gloo),
    ``deadline`` (the step deadline, ``distributed.fence``) and ``verdicts`` (the group's
    step verdicts, kept in the launch's store)."""

    rank: int
    world: int
    cuda: bool
    device: str
    check_group: Any
    deadline: timedelta
    verdicts: StepVerdicts


def join(world: int, what: str, deadline: timedelta = DEFAULT_DEADLINE,
         flag: str = "--dcp") -> Rank | None:
    """Join the torchrun launch of ``world`` ranks (NCCL with a GPU per rank, gloo without
    CUDA); None, after saying how to launch ``what ... flag world``, when this process was
    not started by such a launch. ``deadline``: how long a rank waits for the others at each step
    (default 30 s; ``distributed.fence`` says what it bounds). Setup collectives (before
    the first step: NCCL's first one, graph capture) wait for the group's timeout, 120 s."""
    if int(os.environ.get("WORLD_SIZE", "1")) != world:
        print(f"{what} {flag} {world}: start it with torchrun --nproc-per-node {world} "
              f"-m staticattn {what} {flag} {world} (WORLD_SIZE is "
              f"{os.environ.get('WORLD_SIZE', 'unset')})")
        return None
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    # The launch's store (torchrun's agent hosts it: it outlives every rank) also keeps the
    # step verdicts, which a rank arriving late must still read.
    store, rank, size = next(dist.rendezvous("env://"))
    dist.init_process_group("nccl" if cuda else "gloo", store=dist.PrefixStore("default_pg", store),
                            rank=rank, world_size=size, timeout=timedelta(seconds=120))
    # Host values are exchanged over gloo beside NCCL (validation/dcp_step.py says why).
    # None is the default group: a Rank holds no reference to it (see leave).
    check_group = dist.new_group(backend="gloo") if cuda else None
    device = f"cuda:{torch.cuda.current_device()}" if cuda else "cpu"
    return Rank(dist.get_rank(), world, cuda, device, check_group, deadline,
                StepVerdicts(dist.PrefixStore("staticattn", store)))


def leave(me: Rank) -> None:
    """Leave the launch :func:`join` entered, in step with the other ranks. Call it once
    nothing holds the group any more (arenas, consumers, graph managers released): the
    collection and the barrier let every rank's process groups, and the worker threads gloo
    runs for them, be destroyed here rather than while the interpreter shuts down, where a
    gloo thread that still holds a finished collective's tensors aborts the process."""
    gc.collect()
    dist.barrier(group=me.check_group)
    if me.check_group is not None:
        dist.destroy_process_group(me.check_group)
    dist.destroy_process_group()
    gc.collect()


def abandon(me: Rank, error: RankFailureError) -> NoReturn:
    """Leave a launch whose group broke: say why on stderr and end the process at once
    (status 3), tearing nothing down. A gloo group's worker still waits for the lost rank
    until the group's timeout, and a graph's NCCL kernels for it until its communicator is
    aborted: a teardown (or the interpreter's exit) would wait with them."""
    print(f"rank {me.rank}: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(3)


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
    blocks = kv_pool_blocks(cfg)
    consumer = DCPDecodeAttention(
        cfg, group, num_slots=blocks * (cfg.block_size // cfg.index_compress_ratio),
        topk=TOPK, index_heads=INDEX_HEADS, index_dim=INDEX_DIM, heads=HEADS,
        head_dim=HEAD_DIM)
    return arena, inputs, builder, consumer


def kv_pool_blocks(cfg: ArenaConfig) -> int:
    """Blocks of the KV pool the random steps address: ``max_num_seqs`` requests of unique
    blocks at ``max_model_len``, and the null block."""
    return cfg.max_num_seqs * cdiv(cfg.max_model_len, cfg.block_size) + 1


def graph_pool_blocks(cfg: ArenaConfig) -> int:
    """The pool size a graph manager of these steps bounds slots and block ids with
    (``GraphOptions.num_kv_blocks``): the block ids of :func:`kv_pool_blocks`, and the
    slots of :func:`random_decode_step`, which are token positions (below ``max_model_len``)
    counted in blocks of the slot group (the SWA group where the config has one)."""
    group_block = cfg.swa_block_size if cfg.has_swa else cfg.block_size
    return max(kv_pool_blocks(cfg), cdiv(cfg.max_model_len, group_block))


def random_decode_step(cfg: ArenaConfig, rng: np.random.Generator,
                       num_reqs: int | None = None) -> dict:
    """A uniform decode step of ``k`` requests (``num_reqs``, random when None), ``next_n``
    tokens each at random lengths, and what the DCP consumer reads: ``query_lens``,
    ``seq_lens`` host ints ``(k,)``, ``slot_mapping`` host ints ``(k * next_n,)``;
    ``table`` int32 ``(k, blocks)``, unique block-table rows with as many columns as one GPU
    needs (a rank uses the first); per request ``keys`` float32 ``(entries, INDEX_DIM)`` and
    ``kv`` float32 ``(entries, 2, HEAD_DIM)``, its global compressed entries; per token
    ``q`` float32 ``(k * next_n, INDEX_HEADS, INDEX_DIM)``, ``weights`` float32
    ``(k * next_n, INDEX_HEADS)``, ``q_att`` float32 ``(k * next_n, HEADS, HEAD_DIM)``."""
    n, ratio = cfg.next_n, cfg.index_compress_ratio
    k = int(rng.integers(1, cfg.max_num_seqs + 1)) if num_reqs is None else num_reqs
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
        # Signed head weights: negative scores (and their ties) are drawn too.
        weights=torch.from_numpy(rng.standard_normal((k * n, INDEX_HEADS), np.float32)),
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
