"""DeepSeek V3.2's sparse-MLA prefill on a PCP + DCP rank (``D = P``;
``prefill-context-parallel.md`` §3.6): FlashMLA's ``flash_mla_sparse_fwd`` over a workspace
of every prefill request's keys, all-gathered from the shards of every DCP rank.

A rank holds only its DCP shard of each request's keys, so a prefill token's top-k (request-
relative global positions, from the PCP + DCP prefill indexer) names keys on every rank. Per
step, on DCP rank ``d``, over the rank's prefill extents (``views.extents``: the rank's
prefill rows as one chunk, :mod:`~staticattn.builders.pcp.kv_plan`), in three phases:

1. :meth:`~PCPDCPSparseMLAPrefill.share` -- **local gather**: shard row ``w < slab`` (the
   FlashMLA entry ``k`` whose run of ``S_k`` rows holds it, starting at
   ``workspace_starts[k]``) is this rank's local key ``w - workspace_starts[k]`` of that
   request, read from the rank's ``fp8_ds_mla`` cache through its block-table row and
   dequantised to bf16 into ``workspace[d]``; rows past the padded local total read entry 0
   of block 0 (never attended);
2. :meth:`~PCPDCPSparseMLAPrefill.exchange` -- **all-gather** of the ``slab`` rows over the
   DCP group, rank-major: ``D * slab`` rows, the spec's ``[D * chunk_tot_seqlen, 576]``
   with the rank stride ``slab`` (the capacity) in place of ``chunk_tot_seqlen``;
3. :meth:`~PCPDCPSparseMLAPrefill.attend` -- **rows and attention**: a prefill token's
   top-k value ``j`` below its causal key count (``ke - ks``: its position + 1) becomes
   row ``owner * slab + workspace_starts[k] + local`` (``owner = (j // I) % D``, ``local =
   (j // (D I)) I + j % I``:
   :func:`~staticattn.builders.pcp.workspace_rows.topk_workspace_rows`), -1 otherwise;
   then every local token attends at once (decode tokens and padding, entry -1, have no
   row: zeros from the kernel, not kept), and the prefill tokens' rows of ``out`` take the
   result. Prefill rows need no merge over DCP: each attends to the whole gathered context.

Every shape is fixed by the capacities (``slab = cdiv(W, D)``, ``N``) and nothing reads the
device back, so the phases go into a rank's graph as they are, after the PCP + DCP prefill
indexer whose top-k they read (:meth:`__call__` runs them in order). Split, they let one
process play every rank.

Not served: the decode tokens (their attention over a rank's shard needs FlashMLA's LSE and
the merge over the DCP group), FlashMLA's ``topk_length`` and ``attn_sink`` (V3.2 takes
neither), ``D = TP * P`` (the query's head all-gather over TP).

Memory: the workspace ``D x slab x 576`` bf16 (``slab = cdiv(W, D)``, ``W`` the plan's
workspace), the cache reader's ``slab x 656`` bytes, and ``N x K`` int32 rows.
"""

from __future__ import annotations

import torch

from staticattn.arena import ArenaConfig
from staticattn.builders.batch import Batch
from staticattn.builders.pcp.rank_views import PCPViews
from staticattn.builders.pcp.workspace_rows import topk_workspace_rows
from staticattn.consumers.dcp.merge import gather_rank_major
from staticattn.consumers.real.caches import DS_MLA_BLOCK, DS_MLA_DIM, DS_MLA_NOPE, DsMlaRows
from staticattn.consumers.real.sparse_mla_prefill import (
    V32_SOFTMAX_SCALE,
    SparseFwdFn,
    check_sparse_fwd_shapes,
    check_v32_inputs,
)
from staticattn.errors import ConfigError
from staticattn.kernels.runtime.dsa_libs import FLASH_MLA, require
from staticattn.kernels.staging.stage_inputs import COUNT_DECODE_TOKENS, COUNT_DECODES

__all__ = ["PCPDCPSparseMLAPrefill"]


class PCPDCPSparseMLAPrefill:
    """Writes the sparse-MLA attention of a PCP + DCP rank's prefill tokens (see the module).

    Parameters
    ----------
    config : ArenaConfig
        The rank's arena config: DeepSeek V3.2's layout, ``dcp_world_size`` ranks, its
        ``dcp_rank``.
    views : PCPViews
        The rank's views, with the prefill extents (``views.extents``).
    kv_cache : uint8 ``(num_blocks, 64, 1, 656)``
        This rank's shard of the ``fp8_ds_mla`` cache, at local indices through its block
        table.
    q : bf16 ``(>= N, H, 576)``
        By local token (``N`` the rank's token capacity); ``H`` a multiple of 64.
    topk : int
        ``K``, the width of the top-k rows :meth:`attend` takes: a multiple of 128.
    group : ProcessGroup or None
        The DCP group (None: the default one).
    softmax_scale : float, optional
        Default :data:`~staticattn.consumers.real.sparse_mla_prefill.V32_SOFTMAX_SCALE`.
    sparse_fwd_fn : callable, optional
        Stand-in for ``flash_mla.flash_mla_sparse_fwd``; default FlashMLA's.

    Attributes
    ----------
    workspace : bf16 ``(D, slab, 576)``
        The gathered keys, rank-major (``[dcp_rank]`` this rank's shard rows).
    rows : int32 ``(N, K)``
        The last step's workspace rows per local token, valid ones first, -1 after.
    """

    def __init__(self, config: ArenaConfig, views: PCPViews, *, kv_cache: torch.Tensor,
                 q: torch.Tensor, topk: int, group=None, softmax_scale: float | None = None,
                 sparse_fwd_fn: SparseFwdFn | None = None) -> None:
        if views.extents is None or config.dcp_world_size < 2:
            raise ConfigError("the PCP + DCP sparse-MLA prefill needs a rank of a DCP group "
                              "(dcp_world_size >= 2) whose views hold the prefill extents")
        n = views.extents.ks.numel()
        check_v32_inputs(config, kv_cache, q, q_rows=n, what="the PCP + DCP sparse-MLA prefill")
        check_sparse_fwd_shapes(q.shape[1], topk)
        if sparse_fwd_fn is None:
            sparse_fwd_fn = require(FLASH_MLA).flash_mla_sparse_fwd
        self.views, self.group, self.sparse_fwd_fn = views, group, sparse_fwd_fn
        self.world, self.rank = config.dcp_world_size, config.dcp_rank
        self.interleave = config.dcp_entry_interleave(1)
        self.q, self.topk = q, topk
        self.scale = V32_SOFTMAX_SCALE if softmax_scale is None else float(softmax_scale)
        dev = config.torch_device
        slab = -(-views.extents.deinterleave_idx.numel() // self.world)
        self.workspace = torch.zeros(self.world, slab, DS_MLA_DIM, dtype=torch.bfloat16,
                                     device=dev)
        self.keys = DsMlaRows(kv_cache, slab)
        self.rows = torch.full((n, topk), -1, dtype=torch.int32, device=dev)
        self._w = torch.arange(slab, dtype=torch.int64, device=dev)
        self._blk = torch.empty(slab, dtype=torch.int64, device=dev)
        # The rank stride of the gathered workspace, per entry: the slab, not the plan's S.
        self._stride = torch.full((views.extents.workspace_starts.numel(),), slab,
                                  dtype=torch.int32, device=dev)
        self._tok = torch.arange(n, dtype=torch.int64, device=dev)
        self._u = torch.empty(n, dtype=torch.int64, device=dev)
        self._lens = torch.empty(n, dtype=torch.int32, device=dev)
        self._causal = torch.empty(n, topk, dtype=torch.int32, device=dev)
        self._counts = torch.empty(n, dtype=torch.int32, device=dev)
        self._none = torch.tensor(-1, dtype=torch.int32, device=dev)

    def __call__(self, batch: Batch, topk: torch.Tensor, out: torch.Tensor) -> None:
        self.share(batch)
        self.exchange()
        self.attend(batch, topk, out)

    def share(self, batch: Batch) -> None:
        """Phase 1: this rank's shard rows of every prefill request, dequantised, into
        ``workspace[dcp_rank]``."""
        blk, off = self.views.extents.shard_pages(
            self._w, batch.block_table, batch.step_counts[COUNT_DECODES].long(),
            DS_MLA_BLOCK, self._blk)
        self.keys.read(blk.mul_(DS_MLA_BLOCK).add_(off), self.workspace[self.rank])

    def exchange(self) -> None:
        """Phase 2: the all-gather of every rank's rows (rank-major)."""
        gather_rank_major(self.workspace, self.world, self.rank, self.group)

    def attend(self, batch: Batch, topk: torch.Tensor, out: torch.Tensor) -> None:
        """Phase 3: the prefill tokens' attention into their rows of ``out`` (bf16 ``(>= N,
        H, 512)`` by local token), from their top-k rows in ``topk`` (int32 ``(>= N, K)``,
        request-relative global positions, -1 for none); the other rows are left as they
        are."""
        ext, n = self.views.extents, self._tok.numel()
        # Local token t >= nd_tokens is prefill token u = t - nd_tokens: its keys [ks, ke).
        nd_tokens = batch.step_counts[COUNT_DECODE_TOKENS].long()
        torch.sub(self._tok, nd_tokens, out=self._u).clamp_(0, n - 1)
        torch.sub(ext.ke[self._u], ext.ks[self._u], out=self._lens)
        # A position at or past the token's own key count is no key of its (causal) context;
        # a decode token's (entry -1) rows are all -1 whatever its length.
        causal = self._causal
        torch.where(topk[:n] < self._lens.view(n, 1), topk[:n], self._none, out=causal)
        topk_workspace_rows(causal, ext.request_ids, ext.workspace_starts, self._stride,
                            self.world, self.interleave, DS_MLA_BLOCK,
                            batch.block_table.shape[1], self.rows, self._counts)
        o, _, _ = self.sparse_fwd_fn(self.q[:n], self.workspace.view(-1, 1, DS_MLA_DIM),
                                     self.rows.unsqueeze(1), self.scale, d_v=DS_MLA_NOPE)
        prefill = (ext.request_ids >= 0).view(n, 1, 1)
        torch.where(prefill, o, out[:n], out=out[:n])
