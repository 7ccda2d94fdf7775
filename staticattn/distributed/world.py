"""What every rank of a decode-context-parallel run sets up: the process group, its arena,
the indexer builders (one per index-owning type; DeepSeek V4.1 also the compressed builder)
and the reference DCP consumer (one per index type), and random decode steps with the keys
and queries the consumers read (the same on every rank: one seed)."""

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

from staticattn.arena import ArenaConfig, cache_groups, cdiv
from staticattn.builders import CompressedMetadataBuilder, make_arena
from staticattn.builders.indexer.builder import IndexerMetadataBuilder
from staticattn.consumers.dcp.dcp_decode import DCPDecodeAttention, DCPDecodeLayers
from staticattn.errors import RankFailureError
from staticattn.model import Addressing, Cache, layer_type
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
    """The preset's arena, small enough for a demo: 16 requests, 16K context, the
    consumer's top-k (:data:`TOPK`); the interleave the largest sharded compress ratio (V4:
    R = 4, interleave 4, next_n 2; V4.1: c1a and c2a, interleave 2, next_n 2; V3.2: R = 1,
    interleave 1, next_n 1)."""
    small = dict(max_num_seqs=16, max_num_batched_tokens=64, max_model_len=16384,
                 index_topk=TOPK, device=device)
    interleave = max(ArenaConfig.preset(preset, **small).dcp_sharded_ratios)
    return ArenaConfig.preset(preset, **small, dcp_world_size=world, dcp_rank=rank,
                              cp_kv_cache_interleave_size=interleave)


def dcp_world(cfg: ArenaConfig, group) -> tuple:
    """``(arena, inputs, builders, consumer)`` of one config: its arena, the builders (an
    indexer per index-owning type, and the compressed builder where a type's compressed KV
    has a table of its own: V4.1) and the DCP consumer (:class:`DCPDecodeLayers` of one
    per index type when there are several) over caches for ``max_num_seqs`` requests of
    unique blocks."""
    types = cfg.index_layer_types
    named = len(types) > 1
    builders = [IndexerMetadataBuilder(t.name if named else None) for t in types]
    if any(t.addressing is Addressing.OWN_GROUPS for t in types):
        builders.append(CompressedMetadataBuilder())
    arena, inputs = make_arena(cfg, builders)
    blocks = kv_pool_blocks(cfg)
    layers = [DCPDecodeAttention(
        cfg, group, num_slots=blocks * t.entries_per_block(cfg.block_size), topk=TOPK,
        index_heads=INDEX_HEADS, index_dim=INDEX_DIM, heads=HEADS, head_dim=HEAD_DIM,
        layer_type=t.name if named else None) for t in types]
    return arena, inputs, builders, layers[0] if len(layers) == 1 else DCPDecodeLayers(layers)


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
    needs (a rank uses the first; every sharded cache group takes them, a compressed-KV
    group in reverse request order, see :func:`write_decode_step`); per
    request ``keys`` float32 ``(entries, INDEX_DIM)`` and ``kv`` float32
    ``(entries, 2, HEAD_DIM)``, its global compressed entries at the smallest index ratio
    ``R`` (``entries = L // R``; a type of ratio ``R'`` reads the first ``L // R'``); per token
    ``q`` float32 ``(k * next_n, INDEX_HEADS, INDEX_DIM)``, ``weights`` float32
    ``(k * next_n, INDEX_HEADS)``, ``q_att`` float32 ``(k * next_n, HEADS, HEAD_DIM)``."""
    n, ratio = cfg.next_n, min(t.compress_ratio for t in cfg.index_layer_types)
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


def write_decode_step(inputs, consumer, step: dict) -> None:
    """What the engine has done before a :func:`random_decode_step`: the block-table rows
    (cut to each table's columns: the main one and the sharded cache groups'), each
    consumer's share of the caches, the queries. A compressed-KV group takes the rows in
    reverse request order: its blocks differ from the index-K group's, so a consumer that
    read one cache through the other's table would read another request's entries."""
    cfg = inputs.config
    tables = {"block_table": inputs.block_table} | {
        g.name: inputs.block_tables[g.name] for g in cache_groups(cfg)
        if g.cache is not Cache.COMPRESSOR_STATE}
    for name, view in tables.items():
        rows = step["table"].flip(0) if name.endswith(Cache.COMPRESSED_KV.value) else step["table"]
        view[: rows.shape[0]].copy_(rows[:, : view.shape[1]])
    for layer in getattr(consumer, "layers", (consumer,)):
        index = kv_table = tables["block_table"]
        if layer.own_kv:
            row = layer_type(layer.layer_type)
            index = tables[row.group(Cache.INDEX_K)]
            kv_table = tables[row.group(Cache.COMPRESSED_KV)]
        for b, (keys, kv) in enumerate(zip(step["keys"], step["kv"])):
            entries = int(step["seq_lens"][b]) // layer.ratio
            layer.write_keys(index[b], keys[:entries], kv[:entries], kv_table[b])
        t = step["q"].shape[0]
        for name in ("q", "weights", "q_att"):
            getattr(layer, name)[:t].copy_(step[name])
