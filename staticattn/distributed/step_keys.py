"""The keys of the emulated layers under context parallelism: each token's key, a function
of its request's state and its position, and where keys are written (a flat cache indexed by
slot). The PCP layers (:mod:`staticattn.distributed.pcp_consumer`,
:mod:`staticattn.distributed.pcp_dcp_layer`) compute them for the step's tokens, the
compressor ring (:mod:`staticattn.distributed.pcp_ring_layer`) saves them, and the engine's
stand-in (:func:`write_context`) writes each request's context keys before a step."""

from __future__ import annotations

import torch

from staticattn.kernels.dcp.ownership import dcp_local_index, dcp_owner

__all__ = ["KEY_BITS", "new_keys", "write_context", "write_keys"]

#: Keys are 20-bit values, as the gather consumer's random caches hold.
KEY_BITS = 20
_KEY_MASK = (1 << KEY_BITS) - 1


def new_keys(states: torch.Tensor, positions: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The key of each token, int32 ``out`` ``(n,)`` from its request's state index (int
    ``states`` ``(n,)``) and its position (int ``positions`` ``(n,)``): a hash of both, so a
    key at a wrong slot, of a wrong token or missing shows."""
    return out.copy_((states.long() * 7919 + positions.long() * 40503 + 12345) & _KEY_MASK)


def write_context(cache: torch.Tensor, table_row: torch.Tensor, state: int, count: int,
                  block_size: int, world: int = 1, rank: int = 0, interleave: int = 1) -> None:
    """Write the keys of positions ``[0, count)`` of a request (its state index ``state``,
    its block row int32 ``table_row`` ``(W,)``) into ``cache`` (int32 ``(entries,)``): all
    of them, or under DCP (``world > 1``) those ``rank`` holds, at their local index."""
    pos = torch.arange(count, device=cache.device)
    local = dcp_local_index(pos, world, interleave) if world > 1 else pos
    slots = table_row.long()[local // block_size] * block_size + local % block_size
    if world > 1:
        slots = torch.where(dcp_owner(pos, world, interleave) == rank, slots, -1)
    keys = new_keys(torch.full_like(pos, state), pos, torch.empty_like(pos, dtype=torch.int32))
    write_keys(cache, slots, keys)


def write_keys(cache: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor) -> None:
    """``cache[slots[i]] = keys[i]`` where ``slots[i] >= 0``; graph-safe (no boolean
    indexing): PAD rows rewrite entry 0, a slot of the null block (block 0), with its own
    value. int32 ``cache`` ``(entries,)`` and ``keys`` ``(n,)``, int64 ``slots`` ``(n,)``."""
    live = slots >= 0
    index = torch.where(live, slots, 0)
    cache.scatter_(0, index, torch.where(live, keys, cache[0]))
