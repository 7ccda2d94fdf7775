"""DeepSeek V3.2's sparse-MLA prefill consumer: FlashMLA's ``flash_mla_sparse_fwd`` over each
prefill chunk's keys, gathered from the ``fp8_ds_mla`` cache and dequantised to bf16 (spec
``deepgemm-flashmla.md`` §2.5; ``prefill-context-parallel.md`` §3.6-§3.7).

The chunks are the indexer's (``md["indexer"].prefill``): the ones its prefill top-k scored,
so a token's top-k entries (request-relative positions; for V3.2 the index ratio is 1, so a
key is a token's KV entry) point into the same gathered layout. Per chunk (requests ``[s,
e)``, tokens ``[ts, te)``, ``n`` keys):

1. **gather**: workspace row ``w`` holds key ``j = w - cu_seq_lens[r]`` of the chunk's
   request ``r``, read from the cache at ``block_table[r, j // 64]``, offset ``j % 64``, and
   dequantised (512 NoPE values ``e4m3 * scale`` of their 128-tile, 64 bf16 RoPE values):
   bf16 ``(n, 1, 576)``;
2. **indices**: token ``t``'s top-k entry ``j`` becomes row ``cu_seqlen_ks[t] + j``, and -1
   where ``j < 0`` or ``j >= cu_seqlen_ke[t] - cu_seqlen_ks[t]`` (past the token's causal
   keys: never another request's key);
3. ``out, _, _ = flash_mla_sparse_fwd(q[ts:te], workspace[:n], indices[:, None, :],
   sm_scale, d_v=512)``: bf16 ``(te - ts, H, 512)``, softmax over each token's valid rows
   of ``sm_scale * q . kv`` (576 dims) applied to ``kv[:512]``; a token with no valid row
   gets zeros. Copied into the step's output rows ``[ts, te)``.

Two forms of the same loop, as :class:`~staticattn.consumers.real.indexer_prefill.
IndexerPrefillTopK`'s. An eager build's chunks are planned on the host (``prefill.chunks``):
each runs at its own sizes, and a query sub-chunk (``skip_kv_gather``) reuses the keys
gathered for the chunk before it. A mixed build's plan (``prefill.plan``, inside a graph) runs
the loop over its ``C`` chunk rows at fixed shapes: every row gathers the whole workspace and
attends with all ``T`` tokens, whose indices are -1 outside the chunk, and ``torch.where``
keeps its tokens' outputs; a row past ``num_chunks`` (zeros) keeps none. No host read, no
branch on data, every buffer but FlashMLA's outputs (from the graph's pool) owned.

The chunk layout (which cache entry backs a workspace row, which tokens a planned chunk
holds) is :class:`~staticattn.consumers.real.key_rows.ChunkKeyRows`, shared with the
indexer's prefill: both read the same chunks, from their own caches.

Under prefill context parallelism without DCP a rank's prefill rows are ordinary chunked-
prefill rows reading their prefix from the replicated cache (§3.6, "PCP only"), so the same
consumer serves a PCP rank. Not served: DCP (under DCP alone every token takes the decode
kernel as one batch, :mod:`~staticattn.consumers.real.sparse_mla_mixed`; on a PCP + DCP
rank the workspace is all-gathered, §3.6,
:mod:`~staticattn.distributed.pcp_dcp_sparse_mla`), FlashMLA's ``topk_length`` and
``attn_sink`` (V3.2 takes neither), the decode tokens
(:mod:`~staticattn.consumers.real.sparse_mla_decode`: FlashMLA's sparse FP8 decode reads the
cache itself), and models other than V3.2's layout.

Memory: the workspace holds ``max(config.max_prefill_workspace, max_model_len)`` keys (the
largest chunk the indexer plans), ``576 * 2 + 656`` bytes and 32 bytes of row bookkeeping
each; the indices ``T x K`` int32 and their mask.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from staticattn.arena import ArenaConfig
from staticattn.builders.indexer.metadata import (
    IndexerMetadata,
    IndexerPrefillChunkMetadata,
    IndexerPrefillPlan,
)
from staticattn.consumers.real.caches import (
    DS_MLA_BLOCK,
    DS_MLA_BYTES_PER_TOKEN,
    DS_MLA_DIM,
    DS_MLA_NOPE,
    DsMlaRows,
)
from staticattn.consumers.real.key_rows import ChunkKeyRows
from staticattn.errors import ConfigError
from staticattn.kernels.runtime.dsa_libs import FLASH_MLA, require

__all__ = ["SparseFwdFn", "SparseMLAPrefill", "V32_SOFTMAX_SCALE", "check_prefill_config",
           "check_sparse_fwd_shapes", "check_v32_inputs"]

#: ``(q, kv, indices, sm_scale, d_v=512) -> (out, max_logits, lse)``: FlashMLA's
#: ``flash_mla_sparse_fwd``.
SparseFwdFn = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]

#: V3.2's query-key head dim (128 NoPE + 64 RoPE) sets its softmax scale, ``192 ** -0.5``
#: (before YaRN's ``mscale ** 2``, which a long-context model multiplies in).
V32_SOFTMAX_SCALE = 192 ** -0.5

#: The sm90 kernel's limits (``phase1.cuh``): heads in groups of 64, the top-k in blocks of
#: 128.
_HEAD_GROUP = 64
_TOPK_BLOCK = 128


class SparseMLAPrefill:
    """Writes the sparse-MLA attention of every prefill token of an ``IndexerMetadata`` into
    a step's output.

    Parameters
    ----------
    config : ArenaConfig
        DeepSeek V3.2-like: one index type of ratio 1, pages of 64 tokens, no sliding window,
        no decode context parallelism.
    kv_cache : uint8 ``(num_blocks, 64, 1, 656)``
        The ``fp8_ds_mla`` cache (:func:`~staticattn.consumers.real.caches.
        alloc_ds_mla_cache`).
    q : bf16 ``(>= max_num_batched_tokens, H, 576)``
        By token of the step; ``H`` a multiple of 64.
    topk : int
        ``K``, the width of the top-k rows :meth:`attend_into` takes: a multiple of 128.
    softmax_scale : float, optional
        Default :data:`V32_SOFTMAX_SCALE`.
    sparse_fwd_fn : callable, optional
        Stand-in for ``flash_mla.flash_mla_sparse_fwd`` (a torch emulation for the CPU
        tests); default FlashMLA's.

    Attributes
    ----------
    workspace : bf16 ``(rows, 1, 576)``
        The last chunk's gathered keys; ``rows = max(config.max_prefill_workspace,
        max_model_len)``.
    """

    def __init__(self, config: ArenaConfig, *, kv_cache: torch.Tensor, q: torch.Tensor,
                 topk: int, softmax_scale: float | None = None,
                 sparse_fwd_fn: SparseFwdFn | None = None) -> None:
        check_prefill_config(config, kv_cache, q, topk)
        if sparse_fwd_fn is None:
            sparse_fwd_fn = require(FLASH_MLA).flash_mla_sparse_fwd
        self.sparse_fwd_fn = sparse_fwd_fn
        self.q, self.topk = q, topk
        self.scale = V32_SOFTMAX_SCALE if softmax_scale is None else float(softmax_scale)
        dev = config.torch_device
        # The largest chunk the indexer plans: its workspace, or one request alone.
        w = max(config.max_prefill_workspace, config.max_model_len)
        t = config.max_num_batched_tokens
        self.workspace = torch.zeros(w, 1, DS_MLA_DIM, dtype=torch.bfloat16, device=dev)
        self.rows = DsMlaRows(kv_cache, w)
        self.chunk_rows = ChunkKeyRows(w, config.max_num_seqs, t, DS_MLA_BLOCK, dev)
        self._indices = torch.empty(t * topk, dtype=torch.int32, device=dev)
        self._valid, self._placed = (torch.empty(t * topk, dtype=torch.bool, device=dev)
                                     for _ in range(2))
        self._lens = torch.empty(t, dtype=torch.int32, device=dev)
        self._none = torch.tensor(-1, dtype=torch.int32, device=dev)

    def attend_into(self, idx_md: IndexerMetadata, topk: torch.Tensor,
                    out: torch.Tensor) -> None:
        """Write the attention of every prefill token of ``idx_md`` into ``out`` (bf16 ``(T,
        H, 512)``, ``T`` the step's tokens), from its top-k row in ``topk`` (int32 ``(T,
        K)``, request-relative key positions, -1 for none: the indexer's prefill top-k);
        the other rows of ``out`` are left as they are."""
        pre = idx_md.prefill
        if pre is None:
            return
        if pre.plan is not None:
            self._planned(pre.plan, topk, out)
        for chunk in pre.chunks:
            self._eager_chunk(chunk, topk, out)

    # ------------------------------------------------------------------ eager chunks
    def _eager_chunk(self, chunk: IndexerPrefillChunkMetadata, topk: torch.Tensor,
                     out: torch.Tensor) -> None:
        n, ts, te = chunk.total_seq_lens, chunk.token_start, chunk.token_end
        if n == 0 or te == ts:
            return
        if not chunk.skip_kv_gather:  # a query sub-chunk reads the keys gathered before it
            self.chunk_rows.eager_starts(chunk)
            r = chunk.num_reqs
            self._gather(r, chunk.cu_seq_lens[r:], chunk.block_table, n)
        idx = self._rows_of(topk[ts:te], chunk.cu_seqlen_ks, chunk.cu_seqlen_ke)
        o, _, _ = self.sparse_fwd_fn(self.q[ts:te], self.workspace[:n], idx.unsqueeze(1),
                                     self.scale, d_v=DS_MLA_NOPE)
        out[ts:te].copy_(o)

    # --------------------------------------------------------------- device plan
    def _planned(self, plan: IndexerPrefillPlan, topk: torch.Tensor,
                 out: torch.Tensor) -> None:
        t, r, w = out.shape[0], plan.req_key_start.shape[0], self.workspace.shape[0]
        for c in range(plan.chunk_bounds.shape[0]):
            self.chunk_rows.planned_starts(plan, c)
            self._gather(r, plan.chunk_bounds[c, 4:5], plan.block_table, w)
            in_chunk, ks, ke = self.chunk_rows.planned_tokens(plan, c, t)
            # Tokens outside the chunk have ks = ke = 0: every index -1, zeros out, not kept.
            idx = self._rows_of(topk[:t], ks, ke)
            o, _, _ = self.sparse_fwd_fn(self.q[:t], self.workspace, idx.unsqueeze(1),
                                         self.scale, d_v=DS_MLA_NOPE)
            torch.where(in_chunk.view(t, 1, 1), o, out, out=out)

    # -------------------------------------------------------------------- shared
    def _gather(self, num_reqs: int, num_keys: torch.Tensor, block_table: torch.Tensor,
                rows: int) -> None:
        """Workspace rows ``[0, rows)``: the chunk's keys (:meth:`ChunkKeyRows.locate`),
        dequantised from the cache."""
        blk, offset, slots = self.chunk_rows.locate(num_reqs, num_keys, block_table, rows)
        torch.mul(blk, DS_MLA_BLOCK, out=slots).add_(offset)
        self.rows.read(slots, self.workspace[:rows, 0])

    def _rows_of(self, topk: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor) -> torch.Tensor:
        """int32 ``(n, K)``: workspace rows of the top-k entries of ``n`` tokens whose keys
        are rows ``[ks, ke)`` (int32 ``(n,)`` each); -1 for an entry outside ``[0, ke -
        ks)``."""
        n = topk.shape[0]
        lens = self._lens[:n]
        idx = self._indices[: n * self.topk].view(n, self.topk)
        valid = self._valid[: n * self.topk].view(n, self.topk)
        placed = self._placed[: n * self.topk].view(n, self.topk)
        torch.sub(ke, ks, out=lens)
        torch.lt(topk, lens.view(n, 1), out=valid)
        valid.logical_and_(torch.ge(topk, 0, out=placed))
        torch.add(topk, ks.view(n, 1), out=idx)
        torch.where(valid, idx, self._none, out=idx)
        return idx


def check_prefill_config(config: ArenaConfig, kv_cache: torch.Tensor, q: torch.Tensor,
                         topk: int) -> None:
    """:class:`ConfigError` unless FlashMLA's sm90 sparse prefill serves ``config``, the
    cache (uint8 ``(num_blocks, 64, 1, 656)``), the queries (bf16 ``(>=
    max_num_batched_tokens, H, 576)``) and a top-k of ``topk``."""
    if config.dcp_world_size > 1:
        raise ConfigError(
            "the sparse-MLA prefill runs without decode context parallelism: under DCP a "
            "chunk's keys are spread over the ranks. Under DCP alone attend every token with "
            "the decode kernel as one batch (sparse_mla_mixed.SparseMLAMixedBatch, the "
            "reference's mixed-batch mode); on a PCP + DCP rank, "
            "distributed.pcp_dcp_sparse_mla.PCPDCPSparseMLAPrefill")
    check_v32_inputs(config, kv_cache, q, q_rows=config.max_num_batched_tokens,
                     what="the sparse-MLA prefill")
    check_sparse_fwd_shapes(q.shape[1], topk)


def check_sparse_fwd_shapes(num_heads: int, topk: int) -> None:
    """:class:`ConfigError` unless FlashMLA's sm90 sparse prefill takes ``num_heads`` query
    heads and top-k rows of ``topk``."""
    if topk <= 0 or topk % _TOPK_BLOCK:
        raise ConfigError(f"topk={topk}: FlashMLA's sm90 sparse prefill takes a top-k that is "
                          f"a positive multiple of {_TOPK_BLOCK}")
    if num_heads % _HEAD_GROUP or num_heads == 0:
        raise ConfigError(f"{num_heads} query heads: the sm90 sparse prefill takes a "
                          f"multiple of {_HEAD_GROUP} (the kernel's head group)")


def check_v32_inputs(config: ArenaConfig, kv_cache: torch.Tensor, q: torch.Tensor, *,
                     q_rows: int, what: str) -> None:
    """:class:`ConfigError` unless ``config`` has DeepSeek V3.2's layout (one index type of
    ratio 1, no sliding window, pages of 64), ``kv_cache`` is an ``fp8_ds_mla`` cache (uint8
    ``(num_blocks, 64, 1, 656)``, contiguous) and ``q`` bf16 ``(>= q_rows, H, 576)``: what
    FlashMLA's V3.2 kernels read (``d_qk = 576`` selects them), prefill and decode alike.
    ``what`` names the consumer in the message."""
    owners = config.index_layer_types
    if (len(owners) != 1 or max(owners[0].compress_ratio, 1) != 1 or config.has_swa
            or config.block_size != DS_MLA_BLOCK):
        raise ConfigError(
            f"{what} serves DeepSeek V3.2's layout: one index type of ratio 1 "
            f"(a top-k entry is a token's KV entry), no sliding window, pages of "
            f"{DS_MLA_BLOCK} tokens; this config has index types "
            f"{[(t.name, t.compress_ratio) for t in owners]}, sliding_window="
            f"{config.sliding_window}, block_size={config.block_size}")
    if q.dtype != torch.bfloat16 or q.dim() != 3 or q.shape[2] != DS_MLA_DIM:
        raise ConfigError(f"q must be bf16 (tokens, H, {DS_MLA_DIM}) (d_qk = {DS_MLA_DIM} "
                          f"selects FlashMLA's V3.2 kernels); got {q.dtype} {tuple(q.shape)}")
    if q.shape[0] < q_rows:
        raise ConfigError(f"{what} reads a query row per token: q holds {q.shape[0]} rows, "
                          f"the step up to {q_rows}")
    if (kv_cache.dtype != torch.uint8 or kv_cache.dim() != 4
            or kv_cache.shape[1:] != (DS_MLA_BLOCK, 1, DS_MLA_BYTES_PER_TOKEN)
            or not kv_cache.is_contiguous()):
        raise ConfigError(f"kv_cache must be a contiguous fp8_ds_mla cache, uint8 (num_blocks, "
                          f"{DS_MLA_BLOCK}, 1, {DS_MLA_BYTES_PER_TOKEN}); got {kv_cache.dtype} "
                          f"{tuple(kv_cache.shape)}")
