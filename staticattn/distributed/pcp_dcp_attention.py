"""DeepSeek V3.2's sparse attention of a PCP + DCP rank's prefill tokens, whole, as the rank's
layer (``D = P``; ``prefill-context-parallel.md`` §3.5-§3.6, §3.8): the prefill indexer's
top-k (:class:`~staticattn.distributed.pcp_dcp_indexer.PCPDCPPrefillTopK`, DeepGEMM's
``fp8_mqa_logits`` over each request's whole context gathered from every rank's shard) feeds
the sparse-MLA prefill (:class:`~staticattn.distributed.pcp_dcp_sparse_mla.
PCPDCPSparseMLAPrefill`, FlashMLA's ``flash_mla_sparse_fwd`` over the keys gathered the same
way).

Per step: both share their shard rows, both all-gather them over the DCP group (the index
keys with their scales, then the dequantised attention keys: the reference's two DCP
all-gathers of a prefill chunk), the indexer scores and the attention reads its top-k rows.
Every shape is fixed and nothing reads the device back, so the whole layer goes into the
rank's graph after the builds::

    rank = PCPRank(pcp, cfg, N, max_tokens, group, p, blocks,
                   layer=lambda rank: PCPDCPSparseAttention(rank.config, rank.views, ...))
    rank.capture()
    out = rank.run(query_lens, is_prefilling, num_computed, req_state_idx)  # bf16 (N, H, 512)

Decode tokens' rows are zeros: theirs is the decode path's (FlashMLA's sparse decode over the
rank's shard, merged over the group,
:class:`~staticattn.consumers.real.sparse_mla_decode.SparseMLADecode`).
"""

from __future__ import annotations

import torch

from staticattn.arena import ArenaConfig
from staticattn.builders.batch import Batch
from staticattn.builders.pcp.rank_views import PCPViews
from staticattn.consumers.real.caches import DS_MLA_NOPE
from staticattn.consumers.real.indexer_prefill import MQALogitsFn
from staticattn.consumers.real.sparse_mla_prefill import SparseFwdFn
from staticattn.distributed.pcp_dcp_indexer import PCPDCPPrefillTopK
from staticattn.distributed.pcp_dcp_sparse_mla import PCPDCPSparseMLAPrefill

__all__ = ["PCPDCPSparseAttention"]


class PCPDCPSparseAttention:
    """Step ``(batch, md) -> bf16 (N, H, 512)`` of one PCP + DCP rank (see the module).

    Parameters
    ----------
    config, views : ArenaConfig, PCPViews
        The rank's, as both layers take them (V3.2's layout on a rank of a DCP group; the
        views with the prefill extents).
    index_cache : uint8 ``(num_blocks, 64, 1, d + 4)``
        This rank's shard of the index keys.
    index_q : e4m3 ``(N, h, d)``; weights : fp32 ``(N, h)``
        The indexer's queries and head weights, by local token.
    kv_cache : uint8 ``(num_blocks, 64, 1, 656)``
        This rank's shard of the ``fp8_ds_mla`` cache.
    q : bf16 ``(N, H, 576)``
        The attention's queries, by local token.
    topk : int
        ``K``: a multiple of 128.
    group : ProcessGroup or None
        The DCP group (None: the default one).
    logits_fn, sparse_fwd_fn : callable, optional
        Stand-ins for DeepGEMM's ``fp8_mqa_logits`` and FlashMLA's ``flash_mla_sparse_fwd``.

    Attributes
    ----------
    indexer : PCPDCPPrefillTopK
    attention : PCPDCPSparseMLAPrefill
    out : bf16 ``(N, H, 512)``
        The prefill tokens' attention by local token; other rows zeros.
    """

    def __init__(self, config: ArenaConfig, views: PCPViews, *, index_cache: torch.Tensor,
                 index_q: torch.Tensor, weights: torch.Tensor, kv_cache: torch.Tensor,
                 q: torch.Tensor, topk: int, group=None, logits_fn: MQALogitsFn | None = None,
                 sparse_fwd_fn: SparseFwdFn | None = None) -> None:
        self.attention = PCPDCPSparseMLAPrefill(config, views, kv_cache=kv_cache, q=q,
                                                topk=topk, group=group,
                                                sparse_fwd_fn=sparse_fwd_fn)
        self.indexer = PCPDCPPrefillTopK(config, views, kv_cache=index_cache, q=index_q,
                                         weights=weights, topk=topk, group=group,
                                         logits_fn=logits_fn)
        n = self.indexer.out.shape[0]
        self.out = torch.zeros(n, q.shape[1], DS_MLA_NOPE, dtype=torch.bfloat16,
                               device=config.torch_device)

    def __call__(self, batch: Batch, md=None) -> torch.Tensor:
        self.share(batch)
        self.exchange()
        return self.finish(batch)

    def share(self, batch: Batch) -> None:
        """Both layers' shard rows into their slab of the gathered buffers."""
        self.indexer.share(batch)
        self.attention.share(batch)

    def exchange(self) -> None:
        """The all-gathers over the DCP group: the index keys, then the attention keys."""
        self.indexer.exchange()
        self.attention.exchange()

    def finish(self, batch: Batch) -> torch.Tensor:
        """The prefill tokens' top-k, then their attention; returns :attr:`out`, bf16
        ``(N, H, 512)`` by local token, zeros past the prefill tokens' rows (the attention
        leaves them as they are: the last step's otherwise)."""
        self.out.zero_()
        self.attention.attend(batch, self.indexer.score(batch), self.out)
        return self.out
