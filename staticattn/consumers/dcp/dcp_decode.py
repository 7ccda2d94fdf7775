"""A reference decode consumer under decode context parallelism: the indexer's top-k and the
sparse attention it selects, over KV sharded across ranks and merged with collectives.

Every rank holds, in caches of its own, the compressed entries DCP deals it
(:mod:`staticattn.kernels.dcp.ownership`: groups of ``I // R`` entries round-robin over the ranks),
addressed by local index through the block table: local entry ``j`` of a request sits at
slot ``block_table[row, j // S] * S + j % S`` with ``S = block_size // R`` entries per
block. Per step, for the decode entries of ``md["indexer"].decode`` (``rows x width``, one
per decode token; row ``t // width`` of its block table):

1. **local scores** over the rank's keys ``j < seq_lens[t]`` (the builder's per-rank
   lengths): ``s[t, j] = sum_h relu(q[t, h] . k_j) * w[t, h]`` (the paged-MQA logits
   without FP8 scales), ``-inf`` past the length;
2. **local top-k** of ``K' = min(K, local width)`` by score, ties to the smaller index:
   candidates ``(score, global id)``, the global id from the rank and the interleave
   (``-inf, -1`` for empty ones);
3. **all-gather** of the ``world x K'`` candidates, then the **global top-k**, by score
   (ties: the smaller global id first). Exact: a key in the global top ``K`` is in its
   owner's local top ``K'`` (``K' >= min(K, its owner's keys)``);
4. **sparse attention** over the selected entries: each rank attends to those it owns
   (softmax over ``q_att . k / sqrt(D)`` of its share), giving a partial output and its
   log-sum-exp; **all-gather** of both; **merge**:
   ``lse = logsumexp_r lse_r``, ``out = sum_r exp(lse_r - lse) out_r``.

One consumer serves one index-owning layer type (its indexer's metadata, ``md["indexer"]``
or ``md["indexer.<type>"]``). For a type whose compressed KV cache has a table of its own
(DeepSeek V4.1's c1a and c2a) step 4 reads its entries where a V4.1 layer would: through the
compressed builder's decode operand (``md["compressed"].decode_topk``: the merged top-k as
this rank's local slots of the ``<type>.compressed_kv`` table), and the attention keys and
values live in that group's blocks, the indexer keys in the ``<type>.index_k`` group's.
:class:`DCPDecodeLayers` runs one consumer per index type (V4.1: c1a, then c2a) as one step.

With ``world == 1`` (no group) the same code is the single-GPU step, which the ranks' merged
output and top-k must equal. Graph-safe: every buffer is owned and shaped by capacity, no
host read; the collectives are issued on the current stream (NCCL inside a capture, gloo
eagerly on CPU). Values are float32 (a reference, not a kernel).
"""

from __future__ import annotations

import math

import torch

from staticattn.arena import ArenaConfig, cdiv
from staticattn.builders.batch import Batch
from staticattn.builders.indexer.index_type import index_type
from staticattn.consumers.dcp.merge import gather_rank_major
from staticattn.errors import ConfigError
from staticattn.kernels.dcp.ownership import (
    dcp_global_index,
    dcp_local_count,
    dcp_local_index,
    dcp_owner,
)
from staticattn.kernels.dcp.topk_merge import merge_candidates
from staticattn.model import Addressing

__all__ = ["DCPDecodeAttention", "DCPDecodeLayers"]


class DCPDecodeAttention:
    """Step ``(batch, md) -> (topk_ids, out)`` for the decode tokens of a DCP rank.

    Parameters
    ----------
    config : ArenaConfig
        The rank's config (``dcp_world_size``, ``dcp_rank``, the interleave); world 1 is the
        single-GPU step.
    group : torch.distributed ProcessGroup, optional
        The DCP group (NCCL on GPUs, gloo on CPU); None for the default group. Not used at
        world 1.
    num_slots : int
        Slots of the rank's caches (``num_blocks * block_size // R``).
    topk, index_heads, index_dim, heads, head_dim : int
        The global top-k width ``K``; the indexer's heads and key width; the attention's
        query heads and key/value width (one shared K/V head, as MLA).
    layer_type : str or None
        The index-owning type served ("c2a"), whose indexer is ``md["indexer.<type>"]``;
        None: the config's only one, ``md["indexer"]``. With a table of its own for its
        compressed KV, ``K`` must be the config's ``index_topk`` (the decode operand's
        width).

    Attributes
    ----------
    index_cache : float32 ``(num_slots, index_dim)``
        The rank's indexer keys; the step's queries in ``q`` float32
        ``(max_decode_tokens, index_heads, index_dim)`` and ``weights`` float32
        ``(max_decode_tokens, index_heads)``.
    kv_cache : float32 ``(num_slots, 2, head_dim)``
        The rank's attention keys (``[:, 0]``) and values (``[:, 1]``); the step's queries in
        ``q_att`` float32 ``(max_decode_tokens, heads, head_dim)``.

    Returns (per step) ``topk_ids`` int64 ``(entries, topk)``: the global ids of each decode
    token's selected keys, best first, -1 past its keys; ``out`` float32
    ``(entries, heads, head_dim)``: the merged attention output (0 for a token with no key).
    Both are views of owned buffers, valid until the next step.
    """

    def __init__(self, config: ArenaConfig, group=None, *, num_slots: int, topk: int = 64,
                 index_heads: int = 4, index_dim: int = 16, heads: int = 2,
                 head_dim: int = 16, layer_type: str | None = None) -> None:
        self.world, self.rank = config.dcp_world_size, config.dcp_rank
        self.group = group
        kind = index_type(config, layer_type)
        self.layer_type, self.ratio = layer_type, kind.compress_ratio
        self.key = "indexer" if layer_type is None else f"indexer.{layer_type}"
        # Its compressed KV in a group of its own: attended through the compressed builder's
        # decode operand, whose rows are index_topk wide.
        self.own_kv = kind.row is not None and kind.row.addressing is Addressing.OWN_GROUPS
        if self.own_kv and topk != config.index_topk:
            raise ConfigError(f"topk={topk}: a {layer_type} consumer reads the compressed "
                              f"builder's decode operand, index_topk={config.index_topk} wide")
        ratio = self.ratio
        # Compressed entries are dealt at interleave I // R (kernels/dcp/ownership.py).
        self.interleave = config.dcp_entry_interleave(ratio)
        self.per_block = kind.storage_block_size
        global_width = cdiv(config.max_model_len, ratio)
        self.width = cdiv(global_width, self.world * self.interleave) * self.interleave
        self.topk, self.local_k = topk, min(topk, self.width)
        dev, n = config.torch_device, config.max_decode_tokens
        f32 = dict(dtype=torch.float32, device=dev)
        self.index_cache = torch.zeros(num_slots, index_dim, **f32)
        self.kv_cache = torch.zeros(num_slots, 2, head_dim, **f32)
        self.q = torch.zeros(n, index_heads, index_dim, **f32)
        self.weights = torch.zeros(n, index_heads, **f32)
        self.q_att = torch.zeros(n, heads, head_dim, **f32)
        self.scale = 1.0 / math.sqrt(head_dim)
        # What the ranks exchange, packed so that a step needs two all-gathers, in flat
        # buffers laid out rank-major for every extent (rank r's part of a step of ``n``
        # entries is one contiguous block, gathered in place): per candidate (score, global
        # id) in float64 (ids are exact there), per head the partial output and its
        # log-sum-exp in float32.
        self._cand = torch.zeros(self.world * n * self.local_k * 2, dtype=torch.float64,
                                 device=dev)
        self._att = torch.zeros(self.world * n * heads * (head_dim + 1), **f32)
        self.heads, self.head_dim = heads, head_dim
        self._ids = torch.full((n, topk), -1, dtype=torch.int64, device=dev)
        self._ids32 = torch.full((n, topk), -1, dtype=torch.int32, device=dev)
        self._out = torch.zeros(n, heads, head_dim, **f32)
        self._j = torch.arange(self.width, device=dev)

    # ------------------------------------------------------------------ the caches
    def write_keys(self, block_row: torch.Tensor, index_keys: torch.Tensor,
                   kv: torch.Tensor, kv_block_row: torch.Tensor | None = None) -> None:
        """Write this rank's share of one request's keys into the caches, as an engine's
        KV writes would have: global entry ``e`` held here (local index ``j``) at its slot
        through ``block_row`` (the index keys) and ``kv_block_row`` (the attention's).

        ``block_row``: int32 ``(blocks,)``, the request's row of the index-K table on this
        rank; ``kv_block_row``: its row of the compressed-KV table (default ``block_row``);
        ``index_keys``: float32 ``(entries, index_dim)`` and ``kv``: float32
        ``(entries, 2, head_dim)``, the request's global compressed entries (host or device).
        """
        entries = torch.tensor(index_keys.shape[0])
        held = int(dcp_local_count(entries, self.world, self.rank, self.interleave))
        dev = self.index_cache.device
        j = torch.arange(held, device=dev)
        e = dcp_global_index(j, self.world, self.rank, self.interleave)
        kv_row = block_row if kv_block_row is None else kv_block_row
        slots = self._slots(j[None], block_row.to(dev)[None])[0]
        self.index_cache[slots] = index_keys.to(self.index_cache)[e]
        self.kv_cache[self._slots(j[None], kv_row.to(dev)[None])[0]] = kv.to(self.kv_cache)[e]

    # ------------------------------------------------------------------ the step
    def __call__(self, batch: Batch, md) -> tuple[torch.Tensor, torch.Tensor]:
        decode = md[self.key].decode
        if decode is None:
            return self._ids[:0], self._out[:0]
        rows, width = decode.seq_lens.shape
        n = rows * width
        lens = decode.seq_lens.reshape(n).to(torch.int64)  # (n,) this rank's keys
        table = decode.block_table.repeat_interleave(width, dim=0)  # (n, blocks)
        cand, att = self._exchanged(n)
        self._local_candidates(n, lens, table, cand[self.rank])
        self._gather(cand)
        ids = self._global_topk(n, cand)
        self._attend(n, ids, self._held_slots(n, ids, table, md), att[self.rank])
        self._gather(att)
        return ids, self._merge(n, att)

    #: The all-gathers of a step (:meth:`exchange`'s): the candidates', the partial outputs'.
    collectives = 2

    def exchange(self, num_entries: int) -> None:
        """The step's collectives alone, over ``num_entries`` entries: the candidates'
        all-gather and the partial outputs' (what a bench times for their share of a step).
        """
        for buffer in self._exchanged(num_entries):
            self._gather(buffer)

    def _exchanged(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of the packed exchange buffers for ``n`` entries: candidates float64
        ``(world, n, local_k, 2)`` and attention float32 ``(world, n, heads, head_dim + 1)``."""
        w, k, h, d = self.world, self.local_k, self.heads, self.head_dim
        return (self._cand[: w * n * k * 2].view(w, n, k, 2),
                self._att[: w * n * h * (d + 1)].view(w, n, h, d + 1))

    def _slots(self, j: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """Slots of local entries ``j`` (int64 ``(n, m)``, non-negative) of each token's
        request through its block-table row ``table`` int ``(n, blocks)``."""
        column = torch.div(j, self.per_block, rounding_mode="floor").clamp(max=table.shape[1] - 1)
        return table.gather(1, column).to(torch.int64) * self.per_block + j % self.per_block

    def _local_candidates(self, n: int, lens: torch.Tensor, table: torch.Tensor,
                          mine: torch.Tensor) -> None:
        """This rank's candidates into ``mine`` float64 ``(n, local_k, 2)``."""
        j = self._j.expand(n, -1)
        keys = self.index_cache[self._slots(j, table)]  # (n, width, dim)
        logits = torch.einsum("thd,tjd->thj", self.q[:n], keys).relu()
        scores = (logits * self.weights[:n, :, None]).sum(1)  # (n, width)
        # Keys past the length, and any non-finite score (a NaN would sort first), rank last.
        usable = (j < lens[:, None]) & torch.isfinite(scores)
        scores = scores.masked_fill(~usable, float("-inf"))
        # A stable sort, not topk: among equal scores the smaller local index, which is
        # the smaller global id, so the selection agrees with the global order below
        # (ties are common: relu makes a key's score exactly 0 when every head is negative).
        best, local = torch.sort(scores, dim=1, descending=True, stable=True)
        best, local = best[:, : self.local_k], local[:, : self.local_k]
        ids = dcp_global_index(local, self.world, self.rank, self.interleave)
        mine[..., 0] = best
        mine[..., 1] = torch.where(torch.isfinite(best), ids, -1)

    def _gather(self, buffer: torch.Tensor) -> None:
        gather_rank_major(buffer, self.world, self.rank, self.group)

    def _global_topk(self, n: int, cand: torch.Tensor) -> torch.Tensor:
        out = self._ids[:n]
        merge_candidates(cand, out)
        return out

    def _held_slots(self, n: int, ids: torch.Tensor, table: torch.Tensor,
                    md) -> tuple[torch.Tensor, torch.Tensor]:
        """``(held, slots)``, bool and int64 ``(n, topk)``: which selected entries this rank
        holds and their local slots in ``kv_cache`` (0 where not held). A type with its own
        compressed-KV table reads them from the compressed builder's decode operand (the
        layer's own path); else from the ids through the index table."""
        if self.own_kv:
            self._ids32[:n].copy_(ids)
            local, _ = md["compressed"].decode_topk(self.layer_type, self._ids32)
            local = local[:n, 0]
            return local >= 0, local.clamp(min=0).to(torch.int64)
        e = ids.clamp(min=0)
        held = (ids >= 0) & (dcp_owner(e, self.world, self.interleave) == self.rank)
        return held, self._slots(dcp_local_index(e, self.world, self.interleave), table)

    def _attend(self, n: int, ids: torch.Tensor, held_slots, mine: torch.Tensor) -> None:
        """This rank's partial attention over the selected entries it holds
        (``held_slots``, :meth:`_held_slots`), into ``mine`` float32
        ``(n, heads, head_dim + 1)``: the output, then its log-sum-exp."""
        held, slots = held_slots
        kv = self.kv_cache[slots]  # (n, topk, 2, dim)
        scores = torch.einsum("thd,tkd->thk", self.q_att[:n], kv[:, :, 0]) * self.scale
        scores = scores.masked_fill(~held[:, None, :], float("-inf"))
        lse = torch.logsumexp(scores, dim=2)  # (n, heads); -inf without a key here
        p = torch.exp(scores - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
        mine[..., self.head_dim] = lse
        mine[..., : self.head_dim] = torch.einsum("thk,tkd->thd", p, kv[:, :, 1])

    def _merge(self, n: int, att: torch.Tensor) -> torch.Tensor:
        lse = att[..., self.head_dim]  # (world, n, heads)
        total = torch.logsumexp(lse, dim=0)
        weight = torch.exp(lse - torch.where(torch.isfinite(total), total, 0.0))
        out = self._out[:n]
        torch.sum(weight[..., None] * att[..., : self.head_dim], dim=0, out=out)
        return out


class DCPDecodeLayers:
    """One step of several :class:`DCPDecodeAttention`, one per index-owning type (DeepSeek
    V4.1: c1a, then c2a): ``(batch, md) -> (ids, out, ids, out, ...)`` in their order.

    Attributes
    ----------
    layers : tuple of DCPDecodeAttention
    """

    def __init__(self, layers) -> None:
        self.layers = tuple(layers)

    def __call__(self, batch: Batch, md) -> tuple[torch.Tensor, ...]:
        return tuple(x for layer in self.layers for x in layer(batch, md))

    @property
    def collectives(self) -> int:
        """The all-gathers of a step: every layer's."""
        return sum(layer.collectives for layer in self.layers)

    def exchange(self, num_entries: int) -> None:
        """Every layer's collectives over ``num_entries`` entries."""
        for layer in self.layers:
            layer.exchange(num_entries)
