"""The real indexer's prefill rows on a PCP + DCP rank (``D = P``;
``prefill-context-parallel.md`` §3.5): DeepGEMM's ``fp8_mqa_logits`` over each prefill
request's whole context, gathered in global order from the shards of every rank.

Per step, on DCP rank ``d``, over the rank's global chunk plan (``views.extents``, one chunk;
:mod:`~staticattn.builders.pcp.kv_plan`), in three phases:

1. :meth:`~PCPDCPPrefillTopK.share` -- **local gather**: shard row ``w < W / D`` of region
   ``k`` (``local_cu_seq_lens[k] <= w < local_cu_seq_lens[k + 1]``, the rank's prefill row
   ``nd + k``) holds this rank's local key ``w - local_cu_seq_lens[k]`` of that request (its
   e4m3 values and fp32 scale, read from the rank's sharded cache through its block-table
   row); rows at or past the padded local total read block 0, entry 0 (never scored);
2. :meth:`~PCPDCPPrefillTopK.exchange` -- **all-gather** of the ``W / D`` rows (values and
   scales) over the DCP group, rank-major: ``W`` rows;
3. :meth:`~PCPDCPPrefillTopK.score` -- **deinterleave**: global row ``i`` is gathered row
   ``owner * W / D + idx - owner * S`` (``idx = deinterleave_idx[i]``, ``S`` the padded
   local total, ``owner = idx // S``: the plan strides ranks by ``S``, the buffer by
   ``W / D``); then
   each prefill token ``u`` (the rank's local token ``nd_tokens + u``) scores the keys
   ``[ks[u], ke[u])`` of that order with ``fp8_mqa_logits`` and keeps the top ``K``. The
   indices are request-relative global positions (the reference's prefill top-k under
   PCP + DCP needs no DCP merge); decode tokens' rows are -1 (their top-k is the DCP decode
   path's, merged across the ranks).

Every shape is fixed by the capacities (``W``, ``N``) and nothing reads the device back, so
the three phases go into the rank's graph as they are: made as the rank's layer
(``PCPRank(..., layer=lambda rank: PCPDCPPrefillTopK(rank.config, rank.views, ...))``),
:meth:`__call__` runs them in order after the builds (the all-gather over NCCL inside the
graph, gloo on CPU). Split, they let one process play
every rank (each rank's :meth:`share`, then each reads the others' rows, then :meth:`score`).
"""

from __future__ import annotations

import functools

import torch

from staticattn.arena import ArenaConfig
from staticattn.builders.batch import Batch
from staticattn.builders.pcp.rank_views import PCPViews
from staticattn.consumers.dcp.merge import gather_rank_major
from staticattn.consumers.real.caches import INDEXER_BLOCK
from staticattn.consumers.real.indexer_prefill import MQALogitsFn
from staticattn.consumers.real.key_rows import CacheKeyReader, MaskedTopK
from staticattn.errors import ConfigError
from staticattn.kernels.runtime.dsa_libs import DEEP_GEMM, require
from staticattn.kernels.staging.stage_inputs import COUNT_DECODE_TOKENS, COUNT_DECODES

__all__ = ["PCPDCPPrefillTopK"]


class PCPDCPPrefillTopK:
    """Step ``(batch, md) -> int32 (N, K)`` of one PCP + DCP rank (see the module).

    Parameters
    ----------
    config : ArenaConfig
        The rank's arena config (``dcp_world_size`` ranks, its ``dcp_rank``); one index type
        of ratio 1 whose pages hold 64 entries (DeepSeek V3.2).
    views : PCPViews
        The rank's views, with the prefill extents (``views.extents``).
    kv_cache : uint8 ``(num_blocks, 64, 1, D + 4)``
        This rank's shard of the index keys, at local indices through its block table.
    q : e4m3 ``(N, H, D)``; weights : fp32 ``(N, H)``
        By local token.
    topk : int
        ``K``.
    group : ProcessGroup or None
        The DCP group (None: the default one).
    logits_fn : callable, optional
        Stand-in for ``deep_gemm.fp8_mqa_logits``; default DeepGEMM's.

    Attributes
    ----------
    values : uint8 ``(D, cdiv(W, D), head_dim)``; scales : fp32 ``(D, cdiv(W, D))``
        The gathered rows, rank-major (``[dcp_rank]`` this rank's), ``W`` the plan's
        workspace.
    out : int32 ``(N, K)``
    """

    def __init__(self, config: ArenaConfig, views: PCPViews, *, kv_cache: torch.Tensor,
                 q: torch.Tensor, weights: torch.Tensor, topk: int, group=None,
                 logits_fn: MQALogitsFn | None = None) -> None:
        if views.extents is None or config.dcp_world_size < 2:
            raise ConfigError("the PCP + DCP prefill indexer needs a rank of a DCP group "
                              "(dcp_world_size >= 2) whose views hold the prefill extents")
        index = config.index_layer_type
        if max(index.compress_ratio, 1) != 1 or (
                index.entries_per_block(config.block_size) != INDEXER_BLOCK):
            raise ConfigError(f"the PCP + DCP prefill indexer reads an index K of ratio 1 in "
                              f"pages of {INDEXER_BLOCK} entries (DeepSeek V3.2); "
                              f"{index.name} has ratio {index.compress_ratio}, "
                              f"{index.entries_per_block(config.block_size)} a page")
        if logits_fn is None:
            logits_fn = functools.partial(require(DEEP_GEMM).fp8_mqa_logits,
                                          clean_logits=False)
        self.views, self.group, self.logits_fn = views, group, logits_fn
        self.world, self.rank = config.dcp_world_size, config.dcp_rank
        self.q, self.weights, self.topk = q, weights, topk
        self.keys = CacheKeyReader(kv_cache)
        d, dev = self.keys.head_dim, config.torch_device
        W = views.extents.deinterleave_idx.numel()
        N = views.extents.ks.numel()
        if q.shape[0] < N or weights.shape[0] < N:
            raise ConfigError(f"q and weights need a row per local token ({N}); they hold "
                              f"{q.shape[0]} and {weights.shape[0]}")
        self.width = min(W, config.max_model_len)
        # A rank's shard rows: the plan's global extent D * S (S the padded local total)
        # fits the workspace W (the step check), so S <= W / D.
        slab = -(-W // self.world)
        self.values = torch.zeros(self.world, slab, d, dtype=torch.uint8, device=dev)
        self.scales = torch.zeros(self.world, slab, dtype=torch.float32, device=dev)
        self.ordered = torch.zeros(W, d, dtype=torch.uint8, device=dev)
        self.ordered_scales = torch.zeros(W, dtype=torch.float32, device=dev)
        self.out = torch.full((N, topk), -1, dtype=torch.int32, device=dev)
        self.masked_topk = MaskedTopK(N, self.width, topk, dev)
        self._w = torch.arange(slab, dtype=torch.int64, device=dev)
        self._blk, self._at = (torch.empty(slab, dtype=torch.int64, device=dev)
                               for _ in range(2))
        self._tok = torch.arange(N, dtype=torch.int64, device=dev)
        self._pre = torch.empty(N, dtype=torch.int64, device=dev)
        self._q = torch.empty_like(q[:N])
        self._weights = torch.empty_like(weights[:N])
        self._lens = torch.empty(N, dtype=torch.int32, device=dev)
        self._rows = torch.empty(N, topk, dtype=torch.int32, device=dev)

    def __call__(self, batch: Batch, md=None) -> torch.Tensor:
        self.share(batch)
        self.exchange()
        return self.score(batch)

    def share(self, batch: Batch) -> None:
        """Phase 1: this rank's shard rows of every prefill request into
        ``values[dcp_rank]``, ``scales[dcp_rank]``."""
        blk, off = self.views.extents.shard_pages(
            self._w, batch.block_table, batch.step_counts[COUNT_DECODES].long(),
            INDEXER_BLOCK, self._blk)
        self.keys.read(blk, off, self.values[self.rank], self.scales[self.rank], self._at)

    def exchange(self) -> None:
        """Phase 2: the all-gather of every rank's rows (rank-major)."""
        gather_rank_major(self.values, self.world, self.rank, self.group)
        gather_rank_major(self.scales, self.world, self.rank, self.group)

    def score(self, batch: Batch) -> torch.Tensor:
        """Phase 3: the rows in global order, the prefill tokens' top-k; returns
        :attr:`out`, int32 ``(N, K)`` by local token (-1 rows for decode tokens)."""
        ext = self.views.extents
        src = ext.gathered_rows(self.values.shape[1])
        torch.index_select(self.values.view(-1, self.values.shape[2]), 0, src,
                           out=self.ordered)
        torch.index_select(self.scales.view(-1), 0, src, out=self.ordered_scales)
        # Prefill token u is the rank's local token nd_tokens + u.
        n = self._tok.numel()
        nd_tokens = batch.step_counts[COUNT_DECODE_TOKENS].long()
        torch.add(self._tok, nd_tokens, out=self._pre).clamp_(max=n - 1)
        # e4m3 rows moved as bytes (index_select of float8 is not on every build).
        torch.index_select(self.q[:n].view(torch.uint8), 0, self._pre,
                           out=self._q.view(torch.uint8))
        torch.index_select(self.weights[:n], 0, self._pre, out=self._weights)
        torch.sub(ext.ke, ext.ks, out=self._lens)
        logits = self.logits_fn(self._q, (self.ordered.view(torch.float8_e4m3fn),
                                          self.ordered_scales),
                                self._weights, ext.ks, ext.ke, max_seqlen_k=self.width)
        self.masked_topk(logits, self._lens, self._rows)
        # Local token t >= nd_tokens takes prefill row t - nd_tokens; decode rows are -1.
        torch.sub(self._tok, nd_tokens, out=self._pre).clamp_(min=0)
        torch.index_select(self._rows, 0, self._pre, out=self.out)
        self.out.masked_fill_((self._tok < nd_tokens).view(n, 1), -1)
        return self.out
