"""What the layers of one windowed layer type read beside their window, built from the type's
row of the table (:mod:`staticattn.model.layer_types`): the part of the sparse decode step
(:class:`~staticattn.consumers.real.sparse_decode.SparseDecodeStep`) that differs per type.

By the row's :attr:`~staticattn.model.LayerType.reads`:

* ``Reads.NONE`` (``swaonly``): nothing; FlashMLA gets no extra keys;
* ``Reads.ALL``, the dense type (DeepSeek V4's ``c128a``): every complete compressed entry,
  ``md["swa"].dense_decode_indices`` / ``dense_decode_lens``, flat slots of the type's cache;
* ``Reads.TOPK`` (V4's ``c4a``, V4.1's ``c1a`` and ``c2a``): its indexer's top-k
  (:class:`~staticattn.consumers.real.indexer_topk.IndexerTopKStep`, DeepGEMM's logits),
  turned into global slots of the type's cache by the compressed builder's one
  implementation of that operand (``md["compressed"].decode_topk``, spec §7.1).

The cache of a type that reads compressed entries is owned, MODEL1, ``block_size // R``
entries a page (:mod:`staticattn.consumers.real.caches`); a real model has one per source
layer, one per type keeps the tests light and changes nothing the kernel sees.
"""

from __future__ import annotations

from typing import Any

import torch

from staticattn.arena import ArenaConfig
from staticattn.builders.batch import Batch
from staticattn.consumers.real.caches import alloc_model1_cache
from staticattn.consumers.real.indexer_topk import IndexerTopKStep
from staticattn.errors import GraphError
from staticattn.model import LayerType, Reads

__all__ = ["LayerTypePart"]


class LayerTypePart:
    """One windowed layer type's extra keys for FlashMLA.

    Parameters
    ----------
    config : ArenaConfig
    row : LayerType
        A windowed type of ``config``.
    num_kv_blocks : int
        Blocks of the owned caches.
    indexer_kwargs : dict
        Passed to the :class:`IndexerTopKStep` of a top-k type (``logits_fn``, ...).

    Attributes
    ----------
    row : LayerType
    cache : uint8 MODEL1 cache ``(num_kv_blocks, block_size // R, 1, 584)`` or None
        None for a window-only type.
    indexer : IndexerTopKStep or None
        A top-k type's.
    """

    def __init__(self, config: ArenaConfig, row: LayerType, *, num_kv_blocks: int,
                 indexer_kwargs: dict[str, Any]) -> None:
        self.row = row
        self.cache = None if row.reads is Reads.NONE else alloc_model1_cache(
            num_kv_blocks, row.entries_per_block(config.block_size), config.torch_device)
        self.indexer = (IndexerTopKStep(config, index_type=row.name, num_kv_blocks=num_kv_blocks,
                                        **indexer_kwargs)
                        if row.reads is Reads.TOPK else None)

    def topk(self, batch: Batch, md: dict[str, Any]) -> torch.Tensor | None:
        """The indexer's top-k of a top-k type, int32 ``(num_tokens, K)``; None otherwise."""
        return None if self.indexer is None else self.indexer(batch, md)

    def extra_keys(self, md: dict[str, Any], topk: torch.Tensor | None,
                   num_decode_tokens: int) -> dict[str, torch.Tensor]:
        """FlashMLA's ``extra_*`` keywords for the ``Td = num_decode_tokens`` decode tokens:
        ``extra_k_cache``, ``extra_indices_in_kvcache`` int32 ``(Td, 1, N)`` and
        ``extra_topk_length`` int32 ``(Td,)``; empty for a window-only type. ``topk`` is
        :meth:`topk`'s result."""
        if self.row.reads is Reads.NONE:
            return {}
        if self.row.reads is Reads.ALL:
            swa = md["swa"]
            indices, lens = swa.dense_decode_indices, swa.dense_decode_lens
        else:
            if "compressed" not in md:
                raise GraphError(
                    f"the {self.row.name} layers read their top-k through md['compressed']: "
                    "build the step with CompressedMetadataBuilder (default_builders does)")
            indices, lens = md["compressed"].decode_topk(self.row.name, topk)
        td = num_decode_tokens
        return dict(extra_k_cache=self.cache, extra_indices_in_kvcache=indices[:td],
                    extra_topk_length=lens[:td])
