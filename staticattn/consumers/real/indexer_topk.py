"""The sparse-attention indexer's decode consumer: DeepGEMM paged-MQA logits, then a top-k
masked to each token's visible keys, written into buffers the step owns (spec §5, step 5).

Per step, for the decode part of ``md["indexer"]`` (``rows x width`` entries, one per decode
token):

1. ``logits = deep_gemm.fp8_paged_mqa_logits(q, kv_cache, weights, decode.seq_lens,
   decode.block_table, decode.schedule_metadata, W, clean_logits=False)``:
   fp32 ``(entries, W)``, ``logits[e, j] = sum_h relu(q[e, h] . k_j) * w[e, h] *
   scale_j`` on every 256-key split the schedule covers. Columns past the entry's length hold
   garbage (pages past its table read block 0) or were never written. ``W`` follows the
   metadata's ``max_seq_len`` (:meth:`IndexerTopKStep.context_width`): a graph captured for a
   context bucket scans that bucket's keys, not ``max_model_len``'s;
2. ``masked = where(j < seq_lens[e], logits, -inf)`` into an owned fp32 buffer;
3. ``torch.topk(masked, K, sorted=True, out=(values, indices))`` into owned buffers;
4. ``out[e] = indices`` as int32, ``-1`` where ``index >= seq_lens[e]`` (rows shorter than
   ``K``). Valid entries come first (sorted by logit), so ``count(out[e] >= 0) = min(K,
   seq_lens[e])`` and the valid ones are a prefix: what FlashMLA's ``topk_length`` expects;
5. the short-context fill (``vllm-0.33-extras.md`` §4), decided per row on the device: a
   token whose ``seq_lens[e]`` keys fit the ``K`` columns gets ``[0, ..., n - 1, -1, ...]``
   (the same set as its scored row, in position order); longer rows keep their scored top-k.
   No host branch decides it, so a graph captured over short sequences replays long ones
   scored (vLLM #52492) and the reverse.

Everything has a fixed shape per captured size and no host read, so the whole consumer is
recorded in the graph. DeepGEMM's logits tensor is allocated per call (inside a capture: from
the graph's pool); it never leaves the step. Prefill tokens get rows of -1 unless the step is
made with ``prefill=True``: their rows then come from DeepGEMM's ``fp8_mqa_logits`` over each
prefill chunk's gathered keys (:class:`~staticattn.consumers.real.indexer_prefill.
IndexerPrefillTopK`), eagerly or inside a mixed graph.

Under decode context parallelism (``vllm-0.33-extras.md`` §7.1, the reference's
``_merge_dcp_topk_global``) a rank holds its share of every request's keys, at local
indices, and the builder's lengths and chunks are its own: steps 1-4 and the prefill part
rank the keys this rank holds (``K`` of them, the local top-k, with their logits), then
:class:`~staticattn.consumers.dcp.merge.DCPTopKMerge` packs them as ``(logit, global
position)`` candidates, all-gathers them over the DCP group and keeps the ``K`` best: every
rank's ``out`` is the global top-k, request-relative positions as without DCP, best first
(ties to the smaller position). Exact: a key of the global top ``K`` is among its owner's
local top ``K``. Step 5 is skipped under DCP: a short row holds the same keys, in the
merge's order. The merge is one all-gather of ``world x rows x K`` candidates (8 bytes
each; ``rows`` the decode tokens, with ``prefill`` the step's tokens): every rank of the
group runs the step for the same batch.

On sm90 DeepGEMM takes ``next_n`` in (1, 2) natively and 64-entry pages only, so the
index type's pages must hold 64 entries (V3.2: block 64, R = 1; V4: block 256, R = 4;
V4.1 on the SM90 block 64: ``c1a`` only, ``c2a``'s pages hold 32 --
:func:`index_type_unserved`); ``next_n >= 3`` reaches it flattened (the builder's layout,
one row per token). A config with several index types (V4.1) takes one step per type
(``index_type=``), each reading its own ``md["indexer.<type>"]``.

The step's inputs are owned buffers the caller fills before each step: ``q`` (e4m3
``(max_decode_tokens, H, D)``), ``weights`` (fp32 ``(max_decode_tokens, H)``) and the
cache ``kv_cache`` (:func:`staticattn.consumers.real.caches.write_indexer_cache`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from staticattn.arena import ArenaConfig, cdiv
from staticattn.builders.batch import Batch
from staticattn.builders.indexer.index_type import indexer_name
from staticattn.consumers.dcp.merge import DCPTopKMerge
from staticattn.consumers.real.caches import INDEXER_BLOCK, alloc_indexer_cache
from staticattn.consumers.real.indexer_prefill import IndexerPrefillTopK, MQALogitsFn
from staticattn.consumers.real.key_rows import MaskedTopK
from staticattn.errors import ConfigError, InvalidBatchError
from staticattn.kernels.indexer.short_topk_fill import fill_short_context_topk
from staticattn.kernels.runtime.backend import resolve_backend
from staticattn.kernels.runtime.dsa_libs import DEEP_GEMM, require
from staticattn.model import LayerType

__all__ = ["IndexerTopKStep", "LogitsFn", "index_type_unserved"]

#: ``(q, kv_cache, weights, seq_lens, block_table, schedule, max_context_len) -> logits``,
#: DeepGEMM's ``fp8_paged_mqa_logits`` signature (keyword ``clean_logits`` dropped).
LogitsFn = Callable[..., torch.Tensor]

#: Keys per split of the logits kernel's schedule: a step's logits width is a whole number
#: of them.
_SPLIT = 256

#: Query heads / head dim the sm90 kernel takes (H in {32, 64}, D in {32, 64, 128}).
_HEADS = (32, 64)
_HEAD_DIMS = (32, 64, 128)


class IndexerTopKStep:
    """Step ``(batch, md) -> int32 (num_tokens, K)`` top-k key indices per token.

    Parameters
    ----------
    config : ArenaConfig
        The index type's K pages must hold 64 entries (:func:`index_type_unserved`); on
        CUDA ``num_sms`` must equal DeepGEMM's.
    index_type : str, optional
        The index-owning layer type it serves (DeepSeek V4.1: "c1a", "c2a"); default the
        config's only one. It reads that type's indexer metadata: ``md["indexer"]`` when the
        config has one index type, ``md["indexer.<type>"]`` when it has several.
    num_kv_blocks : int
        Blocks of the owned K cache; block ids of the batch must be below it.
    num_heads, head_dim : int
        Indexer query heads (64) and head dim (128).
    topk : int, optional
        Keys kept per token; default ``config.index_topk``, capped at ``max_context_len``
        (the longest compressed length, ``cdiv(max_model_len, R)``).
    logits_fn : callable, optional
        Stand-in for ``deep_gemm.fp8_paged_mqa_logits`` (a torch emulation lets the CPU
        tests run this step); default DeepGEMM's, which needs CUDA.
    short_context_fill : bool
        Fill the rows whose keys fit the top-k (step 5); default True.
    prefill : bool
        Also score the prefill tokens (:attr:`prefill_topk`); default False (their rows -1).
    mqa_logits_fn : callable, optional
        Stand-in for ``deep_gemm.fp8_mqa_logits`` (the prefill part's); default DeepGEMM's.
    group : ProcessGroup, optional
        Under DCP, the DCP group the top-k merges over (None: the default group).

    Attributes
    ----------
    q : e4m3 ``(rows, num_heads, head_dim)``; row ``t`` = token ``t`` of the step (decode
        tokens first); ``rows`` = ``max_decode_tokens``, with ``prefill``
        ``max_num_batched_tokens``.
    weights : fp32 ``(rows, num_heads)``.
    prefill_topk : IndexerPrefillTopK or None
        The prefill part, with ``prefill``.
    kv_cache : uint8 ``(num_kv_blocks, 64, 1, head_dim + 4)``.
    out : int32 ``(max_num_batched_tokens, topk)``: the step's result, -1 padded.
    scores : fp32 ``(max_num_batched_tokens, topk)`` or None
        Under DCP: the logits of the last step's local top-k, before the merge.
    merge : DCPTopKMerge or None
        Under DCP: the merge of the ranks' local top-k.
    """

    def __init__(
        self,
        config: ArenaConfig,
        *,
        index_type: str | None = None,
        num_kv_blocks: int = 4096,
        num_heads: int = 64,
        head_dim: int = 128,
        topk: int | None = None,
        logits_fn: LogitsFn | None = None,
        short_context_fill: bool = True,
        prefill: bool = False,
        mqa_logits_fn: MQALogitsFn | None = None,
        group=None,
    ) -> None:
        row = (config.index_layer_type if index_type is None
               else _index_row(config, index_type))
        why = index_type_unserved(config, row)
        if why is not None:
            raise ConfigError(why)
        if num_heads not in _HEADS or head_dim not in _HEAD_DIMS:
            raise ConfigError(f"num_heads={num_heads}, head_dim={head_dim}: the sm90 kernel "
                              f"takes heads in {_HEADS} and head dims in {_HEAD_DIMS}")
        if logits_fn is None:
            dg = require(DEEP_GEMM)
            if config.torch_device.type != "cuda":
                raise ConfigError("the DeepGEMM indexer step needs a CUDA arena config")
            if dg.get_num_sms() != config.num_sms:
                raise ConfigError(
                    f"config.num_sms={config.num_sms} but DeepGEMM runs on "
                    f"{dg.get_num_sms()} SMs; the logits kernel asserts the schedule has "
                    "get_num_sms() + 1 rows"
                )
            logits_fn = functools.partial(dg.fp8_paged_mqa_logits, clean_logits=False)
        self.config = config
        #: The index-owning layer type it serves.
        self.layer_type = row
        #: The metadata it reads (``md[name]``): the name ``default_builders`` gives its
        #: indexer builder.
        self.name = indexer_name(config, row)
        self.compress_ratio = max(row.compress_ratio, 1)
        self.logits_fn = logits_fn
        self.short_context_fill = short_context_fill
        self.num_heads, self.head_dim = num_heads, head_dim
        self.max_context_len = cdiv(config.max_model_len, self.compress_ratio)
        self.topk = min(topk or config.index_topk, self.max_context_len)
        dev = config.torch_device
        self.backend = resolve_backend(config.kernel_backend, dev)
        rows, ctx, k = config.max_decode_tokens, self.max_context_len, self.topk
        q_rows = config.max_num_batched_tokens if prefill else rows
        self.q = torch.zeros(q_rows, num_heads, head_dim, dtype=torch.uint8,
                             device=dev).view(torch.float8_e4m3fn)
        self.weights = torch.zeros(q_rows, num_heads, dtype=torch.float32, device=dev)
        self.kv_cache = alloc_indexer_cache(num_kv_blocks, head_dim, dev)
        self.prefill_topk = (IndexerPrefillTopK(
            config, kv_cache=self.kv_cache, q=self.q, weights=self.weights,
            compress_ratio=self.compress_ratio, topk=self.topk, logits_fn=mqa_logits_fn)
            if prefill else None)
        self.out = torch.full((config.max_num_batched_tokens, k), -1, dtype=torch.int32,
                              device=dev)
        # Work buffers at fixed addresses, so no op of the step allocates a result; flat, so
        # that a narrower step (a context bucket's graph) takes contiguous views of them.
        self.masked_topk = MaskedTopK(rows, ctx, k, dev)
        self.scores = self.merge = None
        if config.dcp_world_size > 1:
            self.scores = torch.full((config.max_num_batched_tokens, k), float("-inf"),
                                     dtype=torch.float32, device=dev)
            self.merge = DCPTopKMerge(config, group, topk=k, local_k=k, max_rows=q_rows,
                                      ratio=self.compress_ratio)

    def __call__(self, batch: Batch, md: dict[str, Any]) -> torch.Tensor:
        out = self.out[: batch.num_actual_tokens]
        self.topk_into(md[self.name], out)
        return out

    def topk_into(self, idx_md, out: torch.Tensor) -> None:
        """Write the top-k of every decode token of ``idx_md`` (an ``IndexerMetadata``) into
        ``out`` (``(num_tokens, K)`` int32); rows past the decode tokens get -1, then, with
        :attr:`prefill_topk`, the prefill tokens' top-k. Under DCP every rank of the group
        calls it for the same step (the merge's all-gather)."""
        n = self.local_topk_into(idx_md, out)
        if n:
            self.merge.exchange(n)
            self.merged_into(out, n)

    # The DCP phases, for a caller that plays the merge's all-gather itself.
    def local_topk_into(self, idx_md, out: torch.Tensor) -> int:
        """:meth:`topk_into` without the merge: under DCP ``out`` (int32 ``(T, K)``) gets
        this rank's local top-k (local indices), their logits go to :attr:`scores` and the
        merge's candidates to ``merge.candidates(n)[dcp_rank]``. Returns ``n``, the rows to
        merge (0 without DCP)."""
        td = idx_md.num_decode_tokens
        dec = idx_md.decode
        if dec is not None and td and dec.requires_padding:
            raise InvalidBatchError(
                "the indexer step takes uniform decode rows only; this eager batch has "
                "decode requests of unequal query length (the reference engine packs them "
                "with a host sync first)"
            )
        rows, width = dec.seq_lens.shape if dec is not None else (0, 0)
        entries = rows * width
        if td and entries != td:
            raise InvalidBatchError(f"decode layout {rows}x{width} does not cover the "
                                    f"{td} decode tokens")
        # Checked first, written after: a rejected batch leaves the output as it was.
        if td < out.shape[0]:
            out[td:].fill_(-1)
        scores = None if self.scores is None else self.scores[: out.shape[0]]
        if dec is not None and td:
            self._decode_topk(idx_md, out, scores)
        if self.prefill_topk is not None:
            self.prefill_topk.topk_into(idx_md, out, scores)
        if self.merge is None:
            return 0
        # With the prefill part every row of the step; else the decode tokens' rows.
        n = out.shape[0] if self.prefill_topk is not None else (entries if td else 0)
        if n:
            self.merge.pack(out[:n], scores[:n])
        return n

    def merged_into(self, out: torch.Tensor, n: int) -> None:
        """The global top-k of the first ``n`` rows, from every rank's candidates (after
        the all-gather), into ``out[:n]`` (int32 ``(>= n, K)``)."""
        out[:n].copy_(self.merge.merged(n))

    def _decode_topk(self, idx_md, out: torch.Tensor, scores: torch.Tensor | None) -> None:
        dec = idx_md.decode
        rows, width = dec.seq_lens.shape
        entries = rows * width
        ctx = self.context_width(idx_md.max_seq_len)
        q = self.q[:entries].view(rows, width, self.num_heads, self.head_dim)
        logits = self.logits_fn(q, self.kv_cache, self.weights[:entries], dec.seq_lens,
                                dec.block_table, dec.schedule_metadata, ctx)
        self.masked_topk(logits, dec.seq_lens.view(entries), out[:entries], width=ctx,
                         values=None if scores is None else scores[:entries])
        dst = out[:entries]
        # Under DCP the rows are local, ranked for the merge: the fill would misplace them.
        if self.short_context_fill and scores is None:
            fill_short_context_topk(self.backend, dst, dec.seq_lens.view(entries),
                                    num_rows=entries)

    def context_width(self, max_seq_len: int) -> int:
        """Logits columns a step whose sequences are at most ``max_seq_len`` long needs: its
        compressed length rounded up to whole 256-key splits, at most the capacity's. In a
        graph ``max_seq_len`` is the bound it was captured for (a context bucket's, or
        ``max_model_len``); eagerly, the step's own longest sequence."""
        keys = cdiv(max(int(max_seq_len), 1), self.compress_ratio)
        return min(self.max_context_len, cdiv(keys, _SPLIT) * _SPLIT)


def _index_row(config: ArenaConfig, name: str) -> LayerType:
    rows = {t.name: t for t in config.index_layer_types}
    if name not in rows:
        raise ConfigError(f"index_type {name!r}: this config's index-owning layer types are "
                          f"{list(rows)}")
    return rows[name]


def index_type_unserved(config: ArenaConfig, row: LayerType) -> str | None:
    """Why DeepGEMM's paged MQA logits cannot serve the index type ``row`` of ``config``
    on SM90, or None when they can: the sm90 kernel reads index-K pages of exactly 64
    entries (it asserts ``block_kv == 64``; SM100 also takes 32), and a type's pages hold
    ``block_size // R`` entries. DeepSeek V4.1 on the SM90 kernel block (64): ``c1a`` 64
    (served), ``c2a`` 32 (not); on the SM100 block (128): ``c1a`` 128 (not), ``c2a`` 64."""
    entries = row.entries_per_block(config.block_size)
    if entries == INDEXER_BLOCK:
        return None
    return (f"index type {row.name!r}: DeepGEMM's sm90 paged MQA logits read index-K pages "
            f"of {INDEXER_BLOCK} entries (the kernel asserts block_kv == {INDEXER_BLOCK}), "
            f"but {row.name} pages hold {entries} (block_size {config.block_size} // R "
            f"{max(row.compress_ratio, 1)}); block_size "
            f"{INDEXER_BLOCK * max(row.compress_ratio, 1)} would serve it")
