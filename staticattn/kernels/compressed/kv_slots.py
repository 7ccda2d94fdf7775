"""Per token, for every kv-source layer type at once: the compressed KV slot, the number of
compressed entries it may read and, for a type with a compressor ring, its ring slot
(``docs/spec/deepseek-v41.md`` §5.1, §5.3, §6; ``vllm-semantics.md`` §4.5, §7).

For token ``t`` of request ``b`` at position ``p`` and a type of ratio ``R`` with
``S = block_size // R`` entries per page of its table ``bt``:

* **compressed slot**: the token completing a group of ``R`` positions writes entry
  ``k = p // R``: ``bt[b, k // S] * S + k % S`` (int64) if ``(p + 1) % R == 0``, else -1.
  ``R = 1`` (V4.1's c1a) is the token's own entry, ``bt[b, p // BS] * BS + p % BS``; ``R = 2``
  (c2a) writes from odd positions only. A type with the own-slot gate (V4.1) writes no
  entry from the tokens the step's :class:`~staticattn.kernels.compressed.slot_gate.SlotGate`
  stops (own slot -1, or recomputed by bounded replay);
* **entry count** ``n_c(p) = floor((p + 1) / R)``: the complete compressed entries at or
  before ``p`` (c1a ``p + 1``: its own entry included);
* **ring slot** (a type with its own compressor ring, V4.1's c2a):
  ``ring_block(b) * cap + p % cap`` with ``ring_block(b) = ring_table[b, 0]``; -1 when the
  ring block is the null block 0.

Tokens past the real ones (``t >= query_start_loc[num_reqs]``, graph padding) get -1 slots,
-1 ring slots and count 0. The reference's FULL graphs give padded tokens request 0's real
ring slot from a stale position (spec §5.3); ours give -1.

Example (spec §11 case 1, ``BS = 8``): request 1, ``L = q = 9``, c2a table row ``[12, 16]``
(``S = 4``) -> ``[-1, 48, -1, 49, -1, 50, -1, 51, -1]``; ring block 2, ``cap = 8`` ->
``[16, ..., 23, 16]``; c2a counts ``[0, 1, 1, 2, 2, 3, 3, 4, 4]``.

Example (spec §11 case 4, ``W = 4``): one request, ``L = 12``, ``q = 8`` (positions 4..11),
``replay_start = 4``: positions 4..7 are replayed, so c1a (row ``[3, 4]``) gives
``[-1, -1, -1, -1, 32, 33, 34, 35]`` and c2a (row ``[11, 15]``, ``S = 4``) ``[-1, -1, -1, -1,
-1, 60, -1, 61]``.

Under decode context parallelism (``dcp``: ``W`` ranks, this ``rank``, the token interleave
``I``) a sharded type's entries are dealt with their tokens, and only the rank owning the
token that completes an entry writes it, at its local index through the rank's own table
(``docs/spec/deepseek-v41.md`` §5.1): the position is first localised,
``p' = p // (I W) * I + p % I`` on the rank ``(p // I) % W``, and ``k = p' // R`` (the same
entry as ``dcp_local_index(p // R)`` at interleave ``I // R``, ``I`` being a multiple of
``R``); every other rank gets -1. Counts stay the global ``n_c(p)`` and ring slots stay
every rank's (the rings are replicated). Example (c2a, ``W = 2``, ``I = 2``, ``S = 4``, table
row ``[7]`` on both ranks): positions 0..7 complete entries 0..3 at positions 1, 3, 5, 7,
owned by ranks 0, 1, 0, 1 -> rank 0 ``[-1, 28, -1, -1, -1, 29, -1, -1]``, rank 1
``[-1, -1, -1, 28, -1, -1, -1, 29]``.

One launch serves up to :data:`TYPES_PER_LAUNCH` types (every DeepSeek model has at most two
kv-source types); more take one launch per group of that many.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from staticattn.kernels.compressed.slot_gate import SlotGate, slot_gate_jit
from staticattn.kernels.dcp.ownership import (
    DCPShard,
    dcp_local_index,
    dcp_owner,
    triton_dcp_helpers,
)
from staticattn.kernels.runtime.compiled_launch import grid_size, launch
from staticattn.kernels.runtime.deferred import lazy_jit, publish

__all__ = ["CompressedKVType", "TYPES_PER_LAUNCH", "compressed_kv_slots"]

#: Types one launch of the Triton kernel serves.
TYPES_PER_LAUNCH = 3
_BLOCK = 256


class CompressedKVType(NamedTuple):
    """One kv-source type's static facts and views.

    block_table : int32 device ``(>= num_reqs, C)``, unit column stride
        The table of its compressed KV cache.
    compress_ratio, entries_per_block : int
        ``R`` and ``S = block_size // R``.
    own_slot_gate : bool
        A token whose own slot is -1 writes no entry (V4.1).
    slots_out : int64 device ``(>= num_tokens,)``
    counts_out : int32 device ``(>= num_tokens,)``
    ring_table : int32 device ``(>= num_reqs, >= 1)`` or None
        The compressor ring's table (column 0: the request's ring block); None: no ring.
    ring_capacity : int
        Ring rows per request (``cap``); unused without a ring.
    ring_out : int64 device ``(>= num_tokens,)`` or None
    dcp_sharded : bool
        Under the launch's ``dcp``, the entries are dealt over the ranks (only the owner
        writes, at its local index); else every rank writes every entry.
    """

    block_table: torch.Tensor
    compress_ratio: int
    entries_per_block: int
    own_slot_gate: bool
    slots_out: torch.Tensor
    counts_out: torch.Tensor
    ring_table: torch.Tensor | None = None
    ring_capacity: int = 0
    ring_out: torch.Tensor | None = None
    dcp_sharded: bool = False


def compressed_kv_slots(
    backend: str,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    token_to_req: torch.Tensor,
    gate: SlotGate,
    types: Sequence[CompressedKVType],
    *,
    num_reqs: int,
    num_tokens: int,
    dcp: DCPShard | None = None,
) -> None:
    """Write every type's outputs for tokens ``[0, num_tokens)`` (:class:`CompressedKVType`:
    its slots, counts and ring slots; a sharded type's slots only on the entry's owner).

    Parameters
    ----------
    query_start_loc, positions, token_to_req : torch.Tensor
    num_reqs, num_tokens : int
        The staged token views (int32 and int64 device ``(>= num_tokens,)``) and their static
        extent: :mod:`~staticattn.kernels.staging.stage_inputs`, "Token views".
    gate : SlotGate
        The step's gate, read by the gated types.
    types : sequence of CompressedKVType
    dcp : DCPShard or None
        This rank's shard of the tokens (``interleave`` = ``I``, in tokens), read by the
        sharded types; None: no context parallelism.

    Graph-safe with either backend: static extents, no host read.
    """
    if num_tokens == 0 or not types:
        return
    if backend == "triton":
        for first in range(0, len(types), TYPES_PER_LAUNCH):
            _launch(query_start_loc, positions, token_to_req, gate,
                    types[first:first + TYPES_PER_LAUNCH], num_reqs, num_tokens, dcp)
        return
    world, rank, interleave = dcp if dcp is not None else (1, 0, 1)
    t = torch.arange(num_tokens, device=positions.device)
    real = t < query_start_loc[num_reqs]
    pos = torch.where(real, positions[:num_tokens], 0)
    req = torch.where(real, token_to_req[:num_tokens].long(), 0)
    own_ok = gate.allows(pos, req)
    for ty in types:
        r, s = ty.compress_ratio, ty.entries_per_block
        valid = real & ((pos + 1) % r == 0)
        if ty.own_slot_gate:
            valid = valid & own_ok
        local = pos
        if ty.dcp_sharded and world > 1:
            valid = valid & (dcp_owner(pos, world, interleave) == rank)
            local = dcp_local_index(pos, world, interleave)
        k = torch.where(valid, local, 0) // r
        block = ty.block_table[req, k // s].long()
        ty.slots_out[:num_tokens].copy_(torch.where(valid, block * s + k % s, -1))
        ty.counts_out[:num_tokens].copy_(torch.where(real, (pos + 1) // r, 0))
        if ty.ring_table is not None:
            ring_block = ty.ring_table[req, 0].long()
            ring = ring_block * ty.ring_capacity + pos % ty.ring_capacity
            ty.ring_out[:num_tokens].copy_(torch.where(real & (ring_block != 0), ring, -1))


def _launch(qsl, positions, token_to_req, gate: SlotGate, types, num_reqs,
            num_tokens, dcp: DCPShard | None) -> None:
    args, constexprs = [], {}
    world, rank, interleave = dcp if dcp is not None else (1, 0, 1)
    for j in range(TYPES_PER_LAUNCH):
        # Slots past the types given repeat the first type's tensors, never read.
        ty = types[j] if j < len(types) else types[0]
        ring = ty.ring_table is not None and j < len(types)
        args += [ty.block_table, ty.block_table.stride(0), ty.compress_ratio,
                 ty.entries_per_block, ty.slots_out, ty.counts_out,
                 ty.ring_table if ring else ty.block_table,
                 ty.ring_table.stride(0) if ring else 0, max(ty.ring_capacity, 1),
                 ty.ring_out if ring else ty.slots_out]
        constexprs[f"GATE{j}"] = ty.own_slot_gate
        constexprs[f"RING{j}"] = ring
        constexprs[f"SHARD{j}"] = ty.dcp_sharded and world > 1
    launch(_kernel(), (grid_size(num_tokens, _BLOCK),), qsl, positions, token_to_req,
           *gate.launch_args(qsl), num_reqs, num_tokens, world, rank, interleave, *args,
           NUM_TYPES=len(types),
           HAS_REPLAY=gate.replay_start is not None, **constexprs, BLOCK=_BLOCK)


@lazy_jit(slot_gate_jit, triton_dcp_helpers)
def _kernel(triton, tl, gate_allows, dcp_owner_tl, dcp_local_index_tl, **_):
    @triton.jit
    def compressed_kv_type(i, in_range, real, pos, req, own_ok, world, rank, interleave,
                           table, table_stride, ratio, entries, slots_out, counts_out,
                           ring_table, ring_stride, ring_cap, ring_out, GATE: tl.constexpr,
                           RING: tl.constexpr, SHARD: tl.constexpr):
        # Positions of real tokens are >= 0, so Triton's truncating // and % are floors.
        valid = real & ((pos + 1) % ratio == 0)
        if GATE:
            valid = valid & own_ok
        local = pos
        if SHARD:
            valid = valid & (dcp_owner_tl(pos, world, interleave) == rank)
            local = dcp_local_index_tl(pos, world, interleave)
        k = tl.where(valid, local, 0) // ratio
        block = tl.load(table + req * table_stride + k // entries, mask=valid, other=0)
        slot = block.to(tl.int64) * entries + k % entries
        tl.store(slots_out + i, tl.where(valid, slot, -1), mask=in_range)
        tl.store(counts_out + i, tl.where(real, (pos + 1) // ratio, 0).to(tl.int32),
                 mask=in_range)
        if RING:
            ring_block = tl.load(ring_table + req * ring_stride, mask=real, other=0)
            ring = ring_block.to(tl.int64) * ring_cap + pos % ring_cap
            tl.store(ring_out + i, tl.where(real & (ring_block != 0), ring, -1), mask=in_range)

    publish(globals(), compressed_kv_type)

    @triton.jit
    def compressed_kv_kernel(
        qsl, positions, token_to_req, own_slots, replay_start, window, num_reqs, num_tokens,
        world, rank, interleave,
        table0, stride0, ratio0, entries0, slots0, counts0, ring_table0, ring_stride0, cap0,
        ring0,
        table1, stride1, ratio1, entries1, slots1, counts1, ring_table1, ring_stride1, cap1,
        ring1,
        table2, stride2, ratio2, entries2, slots2, counts2, ring_table2, ring_stride2, cap2,
        ring2,
        NUM_TYPES: tl.constexpr, HAS_REPLAY: tl.constexpr, GATE0: tl.constexpr,
        RING0: tl.constexpr,
        GATE1: tl.constexpr, RING1: tl.constexpr, GATE2: tl.constexpr, RING2: tl.constexpr,
        SHARD0: tl.constexpr, SHARD1: tl.constexpr, SHARD2: tl.constexpr, BLOCK: tl.constexpr,
    ):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        in_range = i < num_tokens
        real = in_range & (i < tl.load(qsl + num_reqs))
        pos = tl.load(positions + i, mask=real, other=0)
        req = tl.load(token_to_req + i, mask=real, other=0).to(tl.int64)
        own_ok = gate_allows(own_slots, replay_start, window, i, pos, req, real, HAS_REPLAY)
        compressed_kv_type(i, in_range, real, pos, req, own_ok, world, rank, interleave, table0,
                           stride0, ratio0, entries0, slots0, counts0, ring_table0, ring_stride0,
                           cap0, ring0, GATE0, RING0, SHARD0)
        if NUM_TYPES > 1:
            compressed_kv_type(i, in_range, real, pos, req, own_ok, world, rank, interleave,
                               table1, stride1, ratio1, entries1, slots1, counts1, ring_table1,
                               ring_stride1, cap1, ring1, GATE1, RING1, SHARD1)
        if NUM_TYPES > 2:
            compressed_kv_type(i, in_range, real, pos, req, own_ok, world, rank, interleave,
                               table2, stride2, ratio2, entries2, slots2, counts2, ring_table2,
                               ring_stride2, cap2, ring2, GATE2, RING2, SHARD2)

    return compressed_kv_kernel
