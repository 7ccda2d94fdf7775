"""DeepSeek V3.2's sparse-MLA decode consumer: FlashMLA's sparse FP8 decode
(``flash_mla_with_kvcache(..., indices=...)``) reading the ``fp8_ds_mla`` cache itself at
each decode token's top-k slots (spec ``deepgemm-flashmla.md`` §2.2-§2.4, §2.6).

The decode tokens are the first ``Td`` of the step (``md["indexer"].decode``; an MTP decode
request of ``n`` tokens gives ``n`` of them). Each is its own FlashMLA batch row with one
query (``b = Td``, ``s_q = 1``), so rows of unequal MTP lengths need no packing. Per step::

    slots[e, i] = block_table[row(e), j // 64] * 64 + j % 64      # j = topk[e, i]
                  (-1 where j < 0, j >= seq_lens[e] or j // 64 past the table)
    sched = get_mla_metadata()[0]                                  # inside the step
    out, lse = flash_mla_with_kvcache(q[:Td] (Td, 1, H, 576), kv_cache, None, None, 512,
                                      sched, softmax_scale=..., is_fp8_kvcache=True,
                                      indices=slots (Td, 1, K))
    attn[:Td] = out (Td, H, 512)

The top-k rows are the indexer's decode top-k (request-relative key positions, -1 for
none); for V3.2 the index ratio is 1, so a position is a token's KV entry. ``row(e)`` and
``seq_lens[e]`` come from the indexer's decode layout: a native layout of ``rows x width``
(a request per row, ``width`` uniform query tokens) puts token ``e`` in row ``e // width``;
a flattened one (MTP in a mixed build, ``next_n >= 3``) has a row per token with the
expanded block table. ``seq_lens[e]`` is the token's own key count (its position + 1), so
an entry past the token -- a later draft token's key, or another request's -- never
attends.

Graph safety: fixed shapes per captured size or bucket, no host read, the slots written
with ``out=`` into owned buffers. FlashMLA's outputs come from the graph's pool (§2.4). A
mixed build decides the split on the device: its ``Td`` is the bucket's decode capacity,
the rows past the real decode tokens have length 0 (all slots -1: zeros from the kernel)
and ``torch.where`` against ``step_counts[3]`` keeps the prefill tokens' rows as they
were. The tile-scheduler holder is made inside :meth:`SparseMLADecode.attend_into` (or
handed in by a caller sharing one over a step's layers), so inside a capture the planner
is recorded and re-plans at every replay (§2.6); V3.2 takes no ``topk_length``, so its
plan depends on ``(Td, H, K)`` alone.

Not served: decode context parallelism (each rank holds part of a token's keys: the
partial outputs need FlashMLA's LSE and a merge over the DCP group), FlashMLA's
``topk_length``, ``attn_sink`` and extra cache (sm90 V3.2 rejects them), an eager batch
whose native decode rows have unequal query lengths (as the indexer's top-k step refuses
it), and the prefill tokens (:mod:`~staticattn.consumers.real.sparse_mla_prefill`).

Memory: the slots ``D x K`` int32 (``D = max_decode_tokens``) with ``D x K`` of int64
block columns, int32 offsets and two masks, 24 bytes a top-k entry in all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from staticattn.arena import ArenaConfig
from staticattn.builders.indexer.metadata import IndexerDecodeMetadata, IndexerMetadata
from staticattn.consumers.real.caches import DS_MLA_BLOCK, DS_MLA_DIM, DS_MLA_NOPE
from staticattn.consumers.real.sparse_decode import DecodeFn
from staticattn.consumers.real.sparse_mla_prefill import V32_SOFTMAX_SCALE, check_v32_inputs
from staticattn.errors import ConfigError, InvalidBatchError
from staticattn.kernels.runtime.dsa_libs import FLASH_MLA, require

__all__ = ["PlanFn", "SparseMLADecode", "check_decode_config"]

#: ``() -> holder``: an empty tile-scheduler holder, FlashMLA's ``get_mla_metadata()[0]``.
PlanFn = Callable[[], Any]

#: Query heads the sm90 sparse decode takes (``splitkv_mla.cuh``).
_HEADS = (64, 128)
#: It reads the top-k in blocks of 64 entries.
_TOPK_BLOCK = 64


class SparseMLADecode:
    """Attends each decode token of an ``IndexerMetadata`` over the cache slots of its top-k
    positions, into the token's row of a step's output.

    Parameters
    ----------
    config : ArenaConfig
        What :func:`check_decode_config` accepts: V3.2's layout, no decode context
        parallelism.
    kv_cache : uint8 ``(num_blocks, 64, 1, 656)``
        The ``fp8_ds_mla`` cache; the kernel reads its entries at the flat slots itself.
    q : bf16 ``(>= max_decode_tokens, H, 576)``
        By token of the step (the decode tokens first: the prefill consumer's ``q`` serves);
        ``H`` 64 or 128.
    topk : int
        ``K``, the width of the top-k rows :meth:`attend_into` takes: a multiple of 64.
    softmax_scale : float, optional
        Default :data:`~staticattn.consumers.real.sparse_mla_prefill.V32_SOFTMAX_SCALE`.
    decode_fn : callable, optional
        Stand-in for ``flash_mla.flash_mla_with_kvcache`` (a torch emulation for the CPU
        tests); default FlashMLA's.
    plan_fn : callable, optional
        Stand-in for ``lambda: flash_mla.get_mla_metadata()[0]``, the empty holder the first
        decode call plans into; default FlashMLA's.

    Attributes
    ----------
    slots : int32 ``(max_decode_tokens, K)``
        The last step's indices: flat cache slots ``block * 64 + offset``, -1 for none.
    """

    def __init__(self, config: ArenaConfig, *, kv_cache: torch.Tensor, q: torch.Tensor,
                 topk: int, softmax_scale: float | None = None,
                 decode_fn: DecodeFn | None = None, plan_fn: PlanFn | None = None) -> None:
        check_decode_config(config, kv_cache, q, topk)
        if decode_fn is None or plan_fn is None:
            flash_mla = require(FLASH_MLA)
            decode_fn = decode_fn or flash_mla.flash_mla_with_kvcache
            plan_fn = plan_fn or (lambda: flash_mla.get_mla_metadata()[0])
        self.decode_fn, self.plan_fn = decode_fn, plan_fn
        self.kv_cache, self.q, self.topk = kv_cache, q, topk
        self.num_heads = q.shape[1]
        self.scale = V32_SOFTMAX_SCALE if softmax_scale is None else float(softmax_scale)
        dev, d = config.torch_device, config.max_decode_tokens
        self.slots = torch.full((d, topk), -1, dtype=torch.int32, device=dev)
        self._block_col = torch.empty(d * topk, dtype=torch.int64, device=dev)
        self._offset = torch.empty(d * topk, dtype=torch.int32, device=dev)
        self._valid, self._placed = (torch.empty(d * topk, dtype=torch.bool, device=dev)
                                     for _ in range(2))
        self._lens = torch.empty(d, dtype=torch.int32, device=dev)
        self._token = torch.arange(d, dtype=torch.int32, device=dev)
        self._is_decode = torch.empty(d, dtype=torch.bool, device=dev)
        self._none = torch.tensor(-1, dtype=torch.int32, device=dev)

    def attend_into(self, idx_md: IndexerMetadata, topk: torch.Tensor, out: torch.Tensor,
                    sched: Any = None) -> None:
        """Write the attention of every decode token of ``idx_md`` into ``out`` (bf16 ``(T,
        H, 512)``, ``T`` the step's tokens), from its top-k row in ``topk`` (int32 ``(T,
        K)``, request-relative key positions, -1 for none: the indexer's decode top-k); the
        other rows of ``out`` are left as they are. ``sched``: a tile-scheduler holder made
        in this step, to share one plan over the step's layers; default a fresh one (never
        pass one made before the step or before a capture: FlashMLA would reuse its
        plan)."""
        dec, td = idx_md.decode, idx_md.num_decode_tokens
        if dec is None or td == 0:
            return
        rows, width = dec.seq_lens.shape
        if dec.requires_padding or rows * width != td:
            raise InvalidBatchError(
                f"the sparse-MLA decode reads token e's keys at row e // width of a uniform "
                f"decode layout; this one is {rows}x{width} for {td} decode tokens"
                f"{' with unequal query lengths' if dec.requires_padding else ''}")
        slots = self.slots_of(dec, topk[:td])
        if sched is None:
            sched = self.plan_fn()
        o, _ = self.decode_fn(
            self.q[:td].view(td, 1, self.num_heads, DS_MLA_DIM), self.kv_cache, None, None,
            DS_MLA_NOPE, sched, softmax_scale=self.scale, is_fp8_kvcache=True,
            indices=slots.view(td, 1, self.topk))
        o = o.view(td, self.num_heads, DS_MLA_NOPE)
        dst = out[:td]
        pre = idx_md.prefill
        if pre is not None and pre.plan is not None:
            # A mixed build: Td is the bucket's capacity; past step_counts[3] the rows are
            # prefill tokens (or padding), whose outputs are not ours.
            keep = self._is_decode[:td]
            torch.lt(self._token[:td], idx_md.step_counts[3], out=keep)
            torch.where(keep.view(td, 1, 1), o, dst, out=dst)
        else:
            dst.copy_(o)

    def slots_of(self, dec: IndexerDecodeMetadata, topk: torch.Tensor) -> torch.Tensor:
        """int32 ``(Td, K)`` (a view of :attr:`slots`): the flat cache slot of every top-k
        entry of the ``Td = rows * width`` decode tokens of ``dec``, from ``topk`` (int32
        ``(Td, K)``); -1 for an entry below 0, at or past the token's ``seq_lens``, or past
        its block-table row."""
        rows, width = dec.seq_lens.shape
        n, k = rows * width, self.topk
        table = dec.block_table[:rows]
        max_blocks = table.shape[1]
        lens = self._lens[:n]
        torch.clamp(dec.seq_lens.view(n), max=max_blocks * DS_MLA_BLOCK, out=lens)
        valid = self._valid[: n * k].view(n, k)
        torch.lt(topk, lens.view(n, 1), out=valid)
        valid.logical_and_(torch.ge(topk, 0, out=self._placed[: n * k].view(n, k)))
        col = self._block_col[: n * k].view(n, k)
        torch.floor_divide(topk, DS_MLA_BLOCK, out=col).clamp_(0, max_blocks - 1)
        slots = self.slots[:n]
        # A table row serves its `width` tokens: gather their K columns each in one go.
        torch.gather(table, 1, col.view(rows, width * k), out=slots.view(rows, width * k))
        slots.mul_(DS_MLA_BLOCK).add_(
            torch.remainder(topk, DS_MLA_BLOCK, out=self._offset[: n * k].view(n, k)))
        torch.where(valid, slots, self._none, out=slots)
        return slots


def check_decode_config(config: ArenaConfig, kv_cache: torch.Tensor, q: torch.Tensor,
                        topk: int) -> None:
    """:class:`ConfigError` unless FlashMLA's sm90 sparse decode serves ``config``, the
    cache (uint8 ``(num_blocks, 64, 1, 656)``), the queries (bf16 ``(>= max_decode_tokens,
    H, 576)``, ``H`` 64 or 128) and a top-k of ``topk``."""
    if config.dcp_world_size > 1:
        raise ConfigError(
            "the sparse-MLA decode runs without decode context parallelism: DCP decode needs "
            "the LSE merge of every rank's partial attention over the DCP group, not here")
    check_v32_inputs(config, kv_cache, q, q_rows=config.max_decode_tokens,
                     what="the sparse-MLA decode")
    if q.shape[1] not in _HEADS:
        raise ConfigError(f"{q.shape[1]} query heads: FlashMLA's sm90 sparse decode takes "
                          f"{_HEADS}")
    if topk <= 0 or topk % _TOPK_BLOCK:
        raise ConfigError(f"topk={topk}: FlashMLA's sm90 sparse decode takes a top-k that is "
                          f"a positive multiple of {_TOPK_BLOCK}")
