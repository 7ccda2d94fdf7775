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

Under decode context parallelism (``D`` ranks, interleave ``I``; ``prefill-context-
parallel.md`` §3.6 "Decode rows", ``vllm-0.33-extras.md`` §7) a rank holds a token's keys
``j`` with ``(j // I) % D`` its rank, at local index ``(j // (D I)) I + j % I`` through its
own block table, and ``seq_lens`` is its share of the token's keys. The top-k rows are the
global ones (the DCP candidate merge's, the same on every rank); each rank keeps the entries
it holds (-1 for the others), attends over them, and the partial outputs merge over the DCP
group as the reference's ``cp_lse_ag_out_ar`` does::

    lse_r  = FlashMLA's LSE of rank r (+inf for "no key here" -> -inf)
    all-gather lse over the group;  L = logsumexp_r lse_r
    out    = all-reduce-sum_r  exp(lse_r - L) * out_r                 # fp32, then bf16

A token none of whose entries any rank holds keeps zeros. The two collectives run on fixed
capacity-shaped buffers, inside a capture as well.

Not served: FlashMLA's ``topk_length``, ``attn_sink`` and extra cache (sm90 V3.2 rejects
them), an eager batch whose native decode rows have unequal query lengths (as the indexer's
top-k step refuses it), and the prefill tokens
(:mod:`~staticattn.consumers.real.sparse_mla_prefill`; every token of a step as one batch
of this kernel: :mod:`~staticattn.consumers.real.sparse_mla_mixed`).

Memory: the slots ``D x K`` int32 (``D = max_decode_tokens``) with ``D x K`` of int64
block columns, int32 offsets and two masks, 24 bytes a top-k entry in all; under DCP the
partial outputs ``D x H x 512`` fp32 and the gathered LSE ``world x D x H`` fp32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from staticattn.arena import ArenaConfig
from staticattn.builders.indexer.metadata import IndexerDecodeMetadata, IndexerMetadata
from staticattn.consumers.dcp.merge import gather_rank_major
from staticattn.consumers.real.caches import DS_MLA_BLOCK, DS_MLA_DIM, DS_MLA_NOPE
from staticattn.consumers.real.sparse_decode import DecodeFn
from staticattn.consumers.real.sparse_mla_prefill import V32_SOFTMAX_SCALE, check_v32_inputs
from staticattn.errors import ConfigError, InvalidBatchError
from staticattn.kernels.dcp.ownership import dcp_local_index, dcp_owner
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
        What :func:`check_decode_config` accepts: V3.2's layout; under DCP its
        ``dcp_world_size``, ``dcp_rank`` and interleave.
    kv_cache : uint8 ``(num_blocks, 64, 1, 656)``
        The ``fp8_ds_mla`` cache (under DCP this rank's share, at local indices); the kernel
        reads its entries at the flat slots itself.
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
    group : ProcessGroup, optional
        Under DCP, the DCP group the partial outputs merge over (None: the default one).

    Attributes
    ----------
    slots : int32 ``(max_decode_tokens, K)``
        The last step's indices: flat cache slots ``block * 64 + offset``, -1 for none
        (under DCP: for an entry another rank holds).
    partial : fp32 ``(max_decode_tokens, H, 512)``
        Under DCP: this rank's output weighted by its share of the softmax, then (after the
        all-reduce) the merged one. None without DCP.
    lse : fp32 ``(world, max_decode_tokens, H)``
        Under DCP: every rank's log-sum-exp, rank-major (``[dcp_rank]`` this rank's, -inf
        where it holds no key of the token). None without DCP.
    """

    def __init__(self, config: ArenaConfig, *, kv_cache: torch.Tensor, q: torch.Tensor,
                 topk: int, softmax_scale: float | None = None,
                 decode_fn: DecodeFn | None = None, plan_fn: PlanFn | None = None,
                 group=None) -> None:
        check_decode_config(config, kv_cache, q, topk, q_rows=self.capacity(config))
        if decode_fn is None or plan_fn is None:
            flash_mla = require(FLASH_MLA)
            decode_fn = decode_fn or flash_mla.flash_mla_with_kvcache
            plan_fn = plan_fn or (lambda: flash_mla.get_mla_metadata()[0])
        self.decode_fn, self.plan_fn = decode_fn, plan_fn
        self.kv_cache, self.q, self.topk = kv_cache, q, topk
        self.num_heads = q.shape[1]
        self.scale = V32_SOFTMAX_SCALE if softmax_scale is None else float(softmax_scale)
        dev, d = config.torch_device, self.capacity(config)
        self.slots = torch.full((d, topk), -1, dtype=torch.int32, device=dev)
        self._block_col = torch.empty(d * topk, dtype=torch.int64, device=dev)
        self._offset = torch.empty(d * topk, dtype=torch.int32, device=dev)
        self._valid, self._placed = (torch.empty(d * topk, dtype=torch.bool, device=dev)
                                     for _ in range(2))
        self._lens = torch.empty(d, dtype=torch.int32, device=dev)
        self._token = torch.arange(d, dtype=torch.int32, device=dev)
        self._keep = torch.empty(d, dtype=torch.bool, device=dev)
        self._none = torch.tensor(-1, dtype=torch.int32, device=dev)
        self.world, self.rank, self.group = config.dcp_world_size, config.dcp_rank, group
        self.interleave = config.dcp_entry_interleave(1)
        self.partial = self.lse = None
        if self.world > 1:
            self.partial = torch.zeros(d, self.num_heads, DS_MLA_NOPE, dtype=torch.float32,
                                       device=dev)
            self.lse = torch.full((self.world, d, self.num_heads), float("-inf"),
                                  dtype=torch.float32, device=dev)
            self._local = torch.empty(d * topk, dtype=torch.int32, device=dev)
            self._total = torch.empty(d, self.num_heads, dtype=torch.float32, device=dev)

    @staticmethod
    def capacity(config: ArenaConfig) -> int:
        """Rows it attends at most: the step's decode tokens."""
        return config.max_decode_tokens

    def attend_into(self, idx_md: IndexerMetadata, topk: torch.Tensor, out: torch.Tensor,
                    sched: Any = None) -> None:
        """Write the attention of every decode token of ``idx_md`` into ``out`` (bf16 ``(T,
        H, 512)``, ``T`` the step's tokens), from its top-k row in ``topk`` (int32 ``(T,
        K)``, request-relative key positions, -1 for none: the indexer's decode top-k); the
        other rows of ``out`` are left as they are. ``sched``: a tile-scheduler holder made
        in this step, to share one plan over the step's layers; default a fresh one (never
        pass one made before the step or before a capture: FlashMLA would reuse its
        plan). Under DCP every rank of the group calls it for the same step: it holds two
        collectives."""
        o = self.attend_local(idx_md, topk, sched)
        if o is None:
            return
        self.write(idx_md, self.merged(o), out)

    def merged(self, o: torch.Tensor) -> torch.Tensor:
        """``o`` (bf16 ``(t, H, 512)``), the first ``t`` rows :meth:`attend_local` attended,
        merged over the DCP group (the LSE all-gather, :meth:`weigh`, the all-reduce): fp32
        ``(t, H, 512)``, a view of :attr:`partial`; ``o`` itself without DCP."""
        if self.world == 1:
            return o
        t = o.shape[0]
        gather_rank_major(self.lse, self.world, self.rank, self.group)
        self.weigh(t)
        # The attended rows alone: the rows past them hold stale sums.
        dist.all_reduce(self.partial[:t], group=self.group)
        return self.partial[:t]

    def attend_local(self, idx_md: IndexerMetadata, topk: torch.Tensor,
                     sched: Any = None) -> torch.Tensor | None:
        """This rank's attention of the ``Td`` decode tokens over the top-k entries it holds:
        bf16 ``(Td, H, 512)``, or None for a step without decode tokens. Under DCP also
        copied into :attr:`partial` (fp32) with its LSE in ``lse[dcp_rank]``, for
        :meth:`weigh` once every rank's LSE is there."""
        dec, td = idx_md.decode, idx_md.num_decode_tokens
        if dec is None or td == 0:
            return None
        rows, width = dec.seq_lens.shape
        if dec.requires_padding or rows * width != td:
            raise InvalidBatchError(
                f"the sparse-MLA decode reads token e's keys at row e // width of a uniform "
                f"decode layout; this one is {rows}x{width} for {td} decode tokens"
                f"{' with unequal query lengths' if dec.requires_padding else ''}")
        return self.attend_slots(self.slots_of(dec, topk[:td]), sched)

    def attend_slots(self, slots: torch.Tensor, sched: Any = None) -> torch.Tensor:
        """The kernel over the first ``t`` query rows, each at its flat cache ``slots``
        (int32 ``(t, K)``, -1 for none): bf16 ``(t, H, 512)``; under DCP also copied into
        :attr:`partial` with its LSE in ``lse[dcp_rank]``."""
        t = slots.shape[0]
        if sched is None:
            sched = self.plan_fn()
        o, lse = self.decode_fn(
            self.q[:t].view(t, 1, self.num_heads, DS_MLA_DIM), self.kv_cache, None, None,
            DS_MLA_NOPE, sched, softmax_scale=self.scale, is_fp8_kvcache=True,
            indices=slots.view(t, 1, self.topk))
        o = o.view(t, self.num_heads, DS_MLA_NOPE)
        if self.world > 1:
            self._take_partial(o, lse)
        return o

    def _take_partial(self, o: torch.Tensor, lse: torch.Tensor) -> None:
        """This rank's output ``o`` (bf16 ``(t, H, 512)``) into :attr:`partial` and its LSE
        (fp32 ``(t, H, 1)``, FlashMLA's) into ``lse[dcp_rank]``."""
        t = o.shape[0]
        self.partial[:t].copy_(o)
        # FlashMLA's LSE is +inf for a token without a key: none here.
        mine = self.lse[self.rank, :t]
        mine.copy_(lse.view(t, self.num_heads))
        mine.masked_fill_(mine == float("inf"), float("-inf"))

    def weigh(self, td: int) -> None:
        """Scale :attr:`partial`'s first ``td`` rows by this rank's share of each token's
        softmax, ``exp(lse_r - logsumexp over the ranks)`` (0 where no rank holds a key)."""
        total = self._total[:td]
        torch.logsumexp(self.lse[:, :td], dim=0, out=total)
        total.masked_fill_(total == float("-inf"), 0.0)
        share = torch.exp(self.lse[self.rank, :td] - total)
        self.partial[:td].mul_(share.unsqueeze(-1))

    def write(self, idx_md: IndexerMetadata, o: torch.Tensor, out: torch.Tensor) -> None:
        """The decode tokens' rows ``o`` (bf16 or fp32 ``(Td, H, 512)``) into ``out`` (bf16
        ``(T, H, 512)``); a mixed build's rows past its real decode tokens are left as they
        were."""
        pre = idx_md.prefill
        # A mixed build: Td is the bucket's capacity; past step_counts[3] the rows are
        # prefill tokens (or padding), whose outputs are not ours.
        mixed = pre is not None and pre.plan is not None
        self.write_rows(o, out, idx_md.step_counts[3] if mixed else None)

    def write_rows(self, o: torch.Tensor, out: torch.Tensor, count: torch.Tensor | None) -> None:
        """``o`` (bf16 or fp32 ``(t, H, 512)``) into ``out[:t]`` (bf16), only the rows below
        ``count`` (an int32 device scalar; None: all ``t``), the others left as they were."""
        t = o.shape[0]
        dst = out[:t]
        o = o.to(dst.dtype)  # the merged fp32 rows under DCP
        if count is None:
            dst.copy_(o)
            return
        keep = self._keep[:t]
        torch.lt(self._token[:t], count, out=keep)
        torch.where(keep.view(t, 1, 1), o, dst, out=dst)

    def slots_of(self, dec: IndexerDecodeMetadata, topk: torch.Tensor) -> torch.Tensor:
        """int32 ``(Td, K)`` (a view of :attr:`slots`): the flat cache slot of every top-k
        entry of the ``Td = rows * width`` decode tokens of ``dec``, from ``topk`` (int32
        ``(Td, K)``); -1 for an entry below 0, at or past the token's ``seq_lens``, or past
        its block-table row, and under DCP for one another rank holds."""
        rows, width = dec.seq_lens.shape
        n, k = rows * width, self.topk
        table = dec.block_table[:rows]
        lens = self._lens[:n]
        torch.clamp(dec.seq_lens.view(n), max=table.shape[1] * DS_MLA_BLOCK, out=lens)
        local, col, valid = self.held_entries(topk, lens, table.shape[1])
        slots = self.slots[:n]
        # A table row serves its `width` tokens: gather their K columns each in one go.
        torch.gather(table, 1, col.view(rows, width * k), out=slots.view(rows, width * k))
        return self.finish_slots(local, valid, slots)

    def held_entries(self, topk: torch.Tensor, lens: torch.Tensor, max_blocks: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For top-k rows ``topk`` (int32 ``(n, K)``) and each token's key count ``lens``
        (int32 ``(n,)``, under DCP this rank's share): ``(local, col, valid)``, each ``(n,
        K)`` -- the entry's index in this rank's keys (int32; the position itself without
        DCP), its block-table column (int64, clamped into the table's ``max_blocks``), and
        whether it is attended here (bool: not -1, below ``lens``, and under DCP held by
        this rank). Views of owned buffers."""
        n, k = topk.shape
        valid = self._valid[: n * k].view(n, k)
        placed = torch.ge(topk, 0, out=self._placed[: n * k].view(n, k))
        if self.world > 1:
            # An entry this rank holds, at its local index: compared with the rank's share
            # of the token's keys (local indices keep the order of the entries held).
            j = topk.clamp(min=0)
            placed.logical_and_(dcp_owner(j, self.world, self.interleave) == self.rank)
            topk = self._local[: n * k].view(n, k)
            topk.copy_(dcp_local_index(j, self.world, self.interleave))
        torch.lt(topk, lens.view(n, 1), out=valid)
        valid.logical_and_(placed)
        col = self._block_col[: n * k].view(n, k)
        torch.floor_divide(topk, DS_MLA_BLOCK, out=col).clamp_(0, max_blocks - 1)
        return topk, col, valid

    def finish_slots(self, local: torch.Tensor, valid: torch.Tensor,
                     slots: torch.Tensor) -> torch.Tensor:
        """``slots`` (int32 ``(n, K)``, the entries' blocks) turned into flat slots ``block *
        64 + local % 64``, -1 where not ``valid`` (:meth:`held_entries`' outputs)."""
        n, k = local.shape
        slots.mul_(DS_MLA_BLOCK).add_(
            torch.remainder(local, DS_MLA_BLOCK, out=self._offset[: n * k].view(n, k)))
        torch.where(valid, slots, self._none, out=slots)
        return slots


def check_decode_config(config: ArenaConfig, kv_cache: torch.Tensor, q: torch.Tensor,
                        topk: int, q_rows: int | None = None) -> None:
    """:class:`ConfigError` unless FlashMLA's sm90 sparse decode serves ``config``, the
    cache (uint8 ``(num_blocks, 64, 1, 656)``), the queries (bf16 ``(>= q_rows, H, 576)``,
    ``H`` 64 or 128; ``q_rows`` default ``max_decode_tokens``) and a top-k of ``topk``."""
    check_v32_inputs(config, kv_cache, q, q_rows=q_rows or config.max_decode_tokens,
                     what="the sparse-MLA decode")
    if q.shape[1] not in _HEADS:
        raise ConfigError(f"{q.shape[1]} query heads: FlashMLA's sm90 sparse decode takes "
                          f"{_HEADS}")
    if topk <= 0 or topk % _TOPK_BLOCK:
        raise ConfigError(f"topk={topk}: FlashMLA's sm90 sparse decode takes a top-k that is "
                          f"a positive multiple of {_TOPK_BLOCK}")
