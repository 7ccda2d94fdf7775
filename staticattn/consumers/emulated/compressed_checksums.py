"""The gather consumer's columns of the compressed-KV metadata (DeepSeek V4.1's ``c1a`` and
``c2a``): what a layer of a kv-source type reads and writes of its compressed caches.

Per real token ``t`` (request ``b``) and per type, two int64 sums:

* read: ``kv_cache`` over the last ``min(n, 32)`` of the ``n = entry_counts[t]`` compressed
  entries the token may see, through the type's compressed-KV block table
  (``entries_per_block`` entries a block) -- the entries a top-k can pick from;
* write: ``kv_cache[slot_mapping[t]]`` where the token writes an entry (slot >= 0), plus
  ``ring_cache[ring_slot_mapping[t]]`` where it has a compressor-ring row (slot >= 0).

Padded tokens write 0 in both. Triton on CUDA (graph-safe: no allocation, no host read),
torch elsewhere (eager only).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from staticattn.kernels.runtime.compiled_launch import launch
from staticattn.kernels.runtime.deferred import lazy_jit
from staticattn.kernels.staging.stage_inputs import COUNT_TOKENS

__all__ = ["CompressedArgs", "compressed_checksums"]

#: How many of the most recent compressed entries the read checksum sums per token.
ENTRY_TAIL = 32


@dataclass(slots=True)
class CompressedArgs:
    """What one launch reads for one kv-source type (views).

    Attributes
    ----------
    num_tokens : int
        Rows to write.
    token_to_req : int32 ``(>= num_tokens,)``
    step_counts : int32 ``(4,)``
        The staging's ``[k, nt, D, Td]``: tokens at or past ``nt`` are padding.
    block_table : int32 ``(num_reqs, C)``
        The type's compressed-KV table.
    entries_per_block : int
        ``S = block_size // R``.
    entry_counts : int32 ``(>= num_tokens,)``
    slot_mapping : int64 ``(>= num_tokens,)``
    ring_slot_mapping : int64 ``(>= num_tokens,)`` or None
    kv_cache, ring_cache : int32 flat caches (``ring_cache`` None without a ring)
    """

    num_tokens: int
    token_to_req: torch.Tensor
    step_counts: torch.Tensor
    block_table: torch.Tensor
    entries_per_block: int
    entry_counts: torch.Tensor
    slot_mapping: torch.Tensor
    ring_slot_mapping: torch.Tensor | None
    kv_cache: torch.Tensor
    ring_cache: torch.Tensor | None


def compressed_checksums(backend: str, a: CompressedArgs, out: torch.Tensor) -> None:
    """Write the read and write sums into columns 0 and 1 of ``out`` (int64
    ``(num_tokens, >= 2)``, a view of the consumer's output whose rows are contiguous)."""
    if a.num_tokens == 0:
        return
    if backend == "triton":
        ring = a.ring_slot_mapping is not None
        launch(_checksum_kernel(), (a.num_tokens,),
               out, out.stride(0), a.token_to_req, a.step_counts, a.block_table,
               a.block_table.stride(0), a.entry_counts, a.slot_mapping,
               a.ring_slot_mapping if ring else a.slot_mapping, a.kv_cache,
               a.ring_cache if ring else a.kv_cache, a.kv_cache.shape[0],
               a.ring_cache.shape[0] if ring else 0, a.entries_per_block,
               RING=ring, TAIL=ENTRY_TAIL)
        return
    _torch(a, out)


def _cached(cache: torch.Tensor, slots: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``cache[slots]`` as int64 where ``keep`` and the slot lies in the cache, else 0."""
    keep = keep & (slots >= 0) & (slots < cache.shape[0])
    return torch.where(keep, cache[slots.long().clamp(0, cache.shape[0] - 1)].long(), 0)


def _torch(a: CompressedArgs, out: torch.Tensor) -> None:
    n_tok = a.num_tokens
    t = torch.arange(n_tok, device=out.device)
    real = t < a.step_counts[COUNT_TOKENS]
    b = torch.where(real, a.token_to_req[:n_tok].long(), 0)
    n = torch.where(real, a.entry_counts[:n_tok].long(), 0)
    k = n[:, None] - ENTRY_TAIL + torch.arange(ENTRY_TAIL, device=out.device)
    keep = real[:, None] & (k >= 0)
    s = a.entries_per_block
    kc = k.clamp(min=0)
    blocks = a.block_table[b[:, None], (kc // s).clamp(max=a.block_table.shape[1] - 1)]
    out[:, 0] = _cached(a.kv_cache, blocks.long() * s + kc % s, keep).sum(-1)
    written = _cached(a.kv_cache, a.slot_mapping[:n_tok], real)
    if a.ring_slot_mapping is not None:
        written = written + _cached(a.ring_cache, a.ring_slot_mapping[:n_tok], real)
    out[:, 1] = written


@lazy_jit()
def _checksum_kernel(triton, tl):
    @triton.jit
    def compressed_checksum_kernel(
        out, out_stride, token_to_req, counts, table, table_stride, entry_counts, slots,
        ring_slots, kv_cache, ring_cache, kv_size, ring_size, entries,
        RING: tl.constexpr, TAIL: tl.constexpr,
    ):
        t = tl.program_id(0)
        real = t < tl.load(counts + 1)
        b = tl.where(real, tl.load(token_to_req + t), 0).to(tl.int64)
        n = tl.where(real, tl.load(entry_counts + t), 0)
        k = n - TAIL + tl.arange(0, TAIL)
        keep = tl.where(real, k >= 0, False)
        kc = tl.maximum(k, 0)
        blk = tl.load(table + b * table_stride + kc // entries, mask=keep, other=0)
        slot = blk.to(tl.int64) * entries + kc % entries
        keep = keep & (slot >= 0) & (slot < kv_size)
        read = tl.sum(tl.load(kv_cache + slot, mask=keep, other=0).to(tl.int64), 0)
        own = tl.load(slots + t)
        ok = real & (own >= 0) & (own < kv_size)
        written = tl.load(kv_cache + tl.where(ok, own, 0), mask=ok, other=0).to(tl.int64)
        if RING:
            ring = tl.load(ring_slots + t)
            ring_ok = real & (ring >= 0) & (ring < ring_size)
            written += tl.load(ring_cache + tl.where(ring_ok, ring, 0), mask=ring_ok,
                               other=0).to(tl.int64)
        row = out + t.to(tl.int64) * out_stride
        tl.store(row, read)
        tl.store(row + 1, written)

    return compressed_checksum_kernel
