"""The sparse-attention indexer's prefill consumer: each prefill chunk's keys gathered from
the paged K cache into a workspace the step owns, DeepGEMM's MQA logits of the chunk's
queries over them, and a top-k masked to each token's visible keys (spec §4.6-§4.7, §5
step 5; ``prefill-context-parallel.md`` §3.4).

Per chunk of ``md["indexer"].prefill`` (requests ``[s, e)``, tokens ``[ts, te)``):

1. **gather**: workspace row ``w`` holds key ``j = w - start[r]`` of the chunk's request
   ``r`` (``start`` = its first key in the chunk's gathered K), read from the cache at
   ``block_table[r, j // 64]``, offset ``j % 64``: its ``D`` e4m3 values and its fp32 scale;
2. ``logits = deep_gemm.fp8_mqa_logits(q, (k, scales), weights, ks, ke, clean_logits=False,
   max_seqlen_k=width)``: fp32 ``(tokens, width)``, ``logits[t, j] = sum_h relu(q[t, h] .
   k[ks + j]) * w[t, h] * scale[ks + j]`` for ``j < ke - ks`` (the chunk-relative columns
   of the reference's prefill path), garbage past it;
3. ``masked = where(j < ke - ks, logits, -inf)``; ``torch.topk(masked, K)``; indices at or
   past ``ke - ks`` become -1. The indices are request-relative compressed positions, the
   reference's prefill top-k.

Two forms of the same loop. An eager build plans the chunks on the host (``prefill.chunks``):
each chunk runs at its own sizes. A mixed build plans them on the device (``prefill.plan``,
inside a graph): the loop runs over the plan's ``C`` chunk rows at fixed shapes, every row
over all ``T`` token rows with ``ks = ke = 0`` outside its tokens and over the whole
workspace; a row past ``num_chunks`` (zeros) writes nothing. No host read, no branch on data,
every buffer but DeepGEMM's logits (from the graph's pool) owned: the loop is recorded in
the graph. Its cost is ``C`` logits launches over ``T x width`` and one top-k; the eager
form's is the chunks' own (a chunk's logits no wider than its keys).

Under prefill context parallelism without DCP a rank's prefill rows are ordinary chunked-
prefill rows (each row its own sequence reading its request's prefix, §3.4), so the same
consumer serves a PCP rank: its tokens' top-k equal the single-GPU step's.

Under decode context parallelism alone (``vllm-0.33-extras.md`` §7.1) a rank holds its
share of every request's keys, and the builder's chunks carry the rank's local row bounds:
the loop gathers the chunk's local keys (``local_cu_seq_lens``, ``local_total_seq_lens``;
the plan's ``local_req_key_start`` and column 6) and ranks them, so each token's row is
the top-k of the keys this rank holds, by local index, with its logits in ``scores``
(:meth:`IndexerPrefillTopK.topk_into`): what the DCP top-k merge takes
(:class:`~staticattn.consumers.real.indexer_topk.IndexerTopKStep` runs it). A PCP + DCP
rank's prefill rows read the whole DCP-gathered context instead (the global chunk plan,
§3.5): :class:`~staticattn.distributed.pcp_dcp_indexer.PCPDCPPrefillTopK`.

Memory: the workspace holds ``max(config.max_prefill_workspace, cdiv(max_model_len, R))``
keys (``D + 4`` bytes and an int64 index each); ``width = min(workspace, cdiv(max_model_len,
R))``; the graph form's score block and the top-k's masked copy, ``T x width`` fp32 each, and
DeepGEMM's logits of each chunk as large (an eager chunk's: its tokens x its keys at most);
the graph form's top-k rows and their logits, ``T x K`` int32 and fp32.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from staticattn.arena import ArenaConfig, cdiv
from staticattn.builders.indexer.metadata import IndexerMetadata, IndexerPrefillChunkMetadata
from staticattn.consumers.real.caches import INDEXER_BLOCK
from staticattn.consumers.real.key_rows import CacheKeyReader, ChunkKeyRows, MaskedTopK
from staticattn.errors import ConfigError
from staticattn.kernels.runtime.dsa_libs import DEEP_GEMM, require

__all__ = ["IndexerPrefillTopK", "MQALogitsFn"]

#: ``(q, (k, scales), weights, ks, ke, max_seqlen_k=...) -> logits``: DeepGEMM's
#: ``fp8_mqa_logits`` with ``clean_logits=False`` bound.
MQALogitsFn = Callable[..., torch.Tensor]

class IndexerPrefillTopK:
    """Writes the top-k of every prefill token of an ``IndexerMetadata`` into a step's output.

    Parameters
    ----------
    config : ArenaConfig
        Under decode context parallelism, the rank's (its keys, at local indices).
    kv_cache : uint8 ``(num_blocks, 64, 1, D + 4)``
        The index type's K cache (:func:`~staticattn.consumers.real.caches.alloc_indexer_cache`).
    q : e4m3 ``(max_num_batched_tokens, H, D)``; weights : fp32 ``(max_num_batched_tokens, H)``
        By token of the step (the decode step's own buffers).
    compress_ratio : int
        ``R`` of the index type: a token at position ``p`` sees ``(p + 1) // R`` keys.
    topk : int
        ``K``, the output's width.
    logits_fn : callable, optional
        Stand-in for ``deep_gemm.fp8_mqa_logits`` (a torch emulation for the CPU tests);
        default DeepGEMM's.

    Attributes
    ----------
    workspace : int
        Keys one chunk may gather.
    k_values : e4m3 ``(workspace, D)``; k_scales : fp32 ``(workspace,)``
        The last chunk's gathered keys.
    """

    def __init__(self, config: ArenaConfig, *, kv_cache: torch.Tensor, q: torch.Tensor,
                 weights: torch.Tensor, compress_ratio: int, topk: int,
                 logits_fn: MQALogitsFn | None = None) -> None:
        if q.shape[0] < config.max_num_batched_tokens:
            raise ConfigError(f"the prefill indexer reads a query row per token: q holds "
                              f"{q.shape[0]} rows, the step up to "
                              f"{config.max_num_batched_tokens} tokens")
        if logits_fn is None:
            logits_fn = functools.partial(require(DEEP_GEMM).fp8_mqa_logits,
                                          clean_logits=False)
        self.logits_fn = logits_fn
        self.q, self.weights, self.topk = q, weights, topk
        #: Under DCP the chunks' local keys are gathered (their local row bounds).
        self.local = config.dcp_world_size > 1
        self.keys = CacheKeyReader(kv_cache)
        self.head_dim = self.keys.head_dim
        self.max_keys = cdiv(config.max_model_len, compress_ratio)
        self.workspace = max(config.max_prefill_workspace, self.max_keys)
        self.width = min(self.workspace, self.max_keys)
        dev = config.torch_device
        w = self.workspace
        self.k_values = torch.zeros(w, self.head_dim, dtype=torch.uint8,
                                    device=dev).view(torch.float8_e4m3fn)
        self.k_scales = torch.zeros(w, dtype=torch.float32, device=dev)
        # Work buffers, fixed addresses (the graph form reads and writes only these).
        t = config.max_num_batched_tokens
        self.chunk_rows = ChunkKeyRows(w, config.max_num_seqs, t, INDEXER_BLOCK, dev)
        self._lens = torch.empty(t, dtype=torch.int32, device=dev)
        self.masked_topk = MaskedTopK(t, self.width, topk, dev)
        self._scores = torch.empty(t * self.width, dtype=torch.float32, device=dev)
        self._score_lens = torch.empty(t, dtype=torch.int32, device=dev)
        self._seen = torch.empty(t, dtype=torch.bool, device=dev)
        self._rows = torch.empty(t * topk, dtype=torch.int32, device=dev)
        self._row_values = torch.empty(t * topk, dtype=torch.float32, device=dev)

    def topk_into(self, idx_md: IndexerMetadata, out: torch.Tensor,
                  scores: torch.Tensor | None = None) -> None:
        """Write the top-k of every prefill token of ``idx_md`` into ``out`` (int32 ``(T,
        K)``, ``T`` the step's tokens); the other rows are left as they are. ``scores``
        (fp32 ``(T, K)``), given: each chosen key's logit into the same place (any value
        where ``out`` is -1), for the DCP merge."""
        pre = idx_md.prefill
        if pre is None:
            return
        if pre.plan is not None:
            self._planned(pre.plan, out, scores)
        for chunk in pre.chunks:
            self._eager_chunk(chunk, out, scores)

    # ------------------------------------------------------------------ eager chunks
    def _eager_chunk(self, chunk: IndexerPrefillChunkMetadata, out: torch.Tensor,
                     scores: torch.Tensor | None) -> None:
        n = chunk.local_total_seq_lens if self.local else chunk.total_seq_lens
        ts, te = chunk.token_start, chunk.token_end
        if n == 0 or te == ts:
            return
        # Request r's keys start at cu_seq_lens[r]; the chunk's keys end at its last entry.
        r = chunk.num_reqs
        self.chunk_rows.eager_starts(chunk, local=self.local)
        cu = chunk.local_cu_seq_lens if self.local else chunk.cu_seq_lens
        self._gather(r, cu[r:], chunk.block_table, n)
        lens = self._lens[: te - ts]
        torch.sub(chunk.cu_seqlen_ke, chunk.cu_seqlen_ks, out=lens)
        # A token's keys are a part of the chunk's: its logits need no more columns.
        width = min(self.width, n)
        logits = self.logits_fn(self.q[ts:te], self._keys(n), self.weights[ts:te],
                                chunk.cu_seqlen_ks, chunk.cu_seqlen_ke, max_seqlen_k=width)
        self.masked_topk(logits, lens, out[ts:te], width=width,
                         values=None if scores is None else scores[ts:te])

    # --------------------------------------------------------------- device plan
    def _planned(self, plan, out: torch.Tensor, scores: torch.Tensor | None) -> None:
        t, r = out.shape[0], plan.req_key_start.shape[0]
        lens = self._lens[:t]
        rows = self._rows[: t * self.topk].view(t, self.topk)
        # Each chunk's logits go to its tokens' rows of one score block; one top-k follows.
        block = self._scores[: t * self.width].view(t, self.width)
        score_lens, seen = self._score_lens[:t], self._seen[:t]
        score_lens.zero_()
        seen.zero_()
        for c in range(plan.chunk_bounds.shape[0]):
            self.chunk_rows.planned_starts(plan, c, local=self.local)
            # Column 4: the chunk's keys; 6: this DCP rank's share of them.
            keys = plan.chunk_bounds[c, 6:7] if self.local else plan.chunk_bounds[c, 4:5]
            self._gather(r, keys, plan.block_table, self.workspace)
            in_chunk, ks, ke = self.chunk_rows.planned_tokens(plan, c, t)
            torch.sub(ke, ks, out=lens)
            logits = self.logits_fn(self.q[:t], self._keys(self.workspace), self.weights[:t],
                                    ks, ke, max_seqlen_k=self.width)
            torch.where(in_chunk.view(t, 1), logits[:, : self.width], block, out=block)
            torch.where(in_chunk, lens, score_lens, out=score_lens)
            seen.logical_or_(in_chunk)
        values = None if scores is None else self._row_values[: t * self.topk].view(t, -1)
        self.masked_topk(block, score_lens, rows, values=values)
        torch.where(seen.view(t, 1), rows, out, out=out)
        if scores is not None:
            torch.where(seen.view(t, 1), values, scores, out=scores)

    # -------------------------------------------------------------------- shared
    def _gather(self, num_reqs: int, num_keys: torch.Tensor, block_table: torch.Tensor,
                rows: int) -> None:
        """Workspace rows ``[0, rows)``: the chunk's gathered keys
        (:meth:`ChunkKeyRows.locate`), values and scales read from the K cache."""
        blk, offset, scratch = self.chunk_rows.locate(num_reqs, num_keys, block_table, rows)
        self.keys.read(blk, offset, self.k_values[:rows].view(torch.uint8),
                       self.k_scales[:rows], scratch)

    def _keys(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_values[:rows], self.k_scales[:rows]
