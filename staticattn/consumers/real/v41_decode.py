"""The DeepSeek V4.1 decode consumer: per index type DeepGEMM's indexer logits and a top-k,
turned into that type's compressed slots, and FlashMLA's sparse FP8 decode per layer type
over the window plus those slots (``docs/spec/deepseek-v41.md`` §6-§7).

Per step, for the ``Td`` decode tokens::

    for t in index types (c1a, c2a):
        topk[t] = IndexerTopKStep(config, index_type=t)(batch, md)   # md["indexer.<t>"]
        idx[t], lens[t] = md["compressed"].decode_topk(t, topk[t])    # global slots, §7.1
    for every layer l of type swaonly / c1a / c2a:
        flash_mla_with_kvcache(q[l, :Td], swa_cache, None, None, 512,
                               md["swa"].tile_sched(type),        # one holder per type
                               indices=decode_swa_indices, topk_length=decode_swa_lens,
                               extra_k_cache=cache[type],         # c1a / c2a only
                               extra_indices_in_kvcache=idx[type],
                               extra_topk_length=lens[type], ...)

What the SM90 kernels serve (the kit's DeepGEMM v2.6.1 and FlashMLA ``9241ae3``):

* FlashMLA's sm90 sparse decode takes any page size for the window (V4.1: 32 tokens) and
  for the extra keys (c1a: ``block_size`` entries, c2a: ``block_size // 2``), a window
  that is a multiple of 64 (128) and any extra top-k (512, 1024);
* DeepGEMM's sm90 paged MQA logits read 64-entry index-K pages only, so on the SM90
  kernel block (64) the ``c2a`` indexer, whose pages hold 32 entries, cannot run there
  (:func:`~staticattn.consumers.real.indexer_topk.index_type_unserved`): asking for it is a
  :class:`~staticattn.errors.ConfigError` naming the shape; ``index_types=("c1a",)``
  serves the window-only and c1a layers.

Caches (owned, MODEL1 layout): one SWA cache shared by all layers and one compressed cache
per top-k type, as :class:`~staticattn.consumers.real.sparse_decode.SparseDecodeStep` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from staticattn.arena import ArenaConfig
from staticattn.builders.batch import Batch
from staticattn.consumers.real.caches import MODEL1_DIM, alloc_model1_cache
from staticattn.consumers.real.indexer_topk import IndexerTopKStep, LogitsFn
from staticattn.consumers.real.sparse_decode import (
    DecodeFn,
    check_attention_config,
    decode_layers,
    layer_buffers,
)
from staticattn.errors import ConfigError
from staticattn.kernels.runtime.dsa_libs import FLASH_MLA, require
from staticattn.model import Reads

__all__ = ["V41DecodeStep"]


class V41DecodeStep:
    """Step ``(batch, md) -> {"topk.<type>": int32 (T, K) per index type, "attn": bf16
    (T, num_layers, H, 512)}``.

    Parameters
    ----------
    config : ArenaConfig
        A DeepSeek V4.1 preset's (several index types, the compressed builder).
    index_types : sequence of str, optional
        The index types whose indexer and layers run; default all of the config's. A type
        DeepGEMM's sm90 logits cannot serve raises :class:`ConfigError` saying why.
    num_kv_blocks : int
        Blocks of every owned cache (block ids of every table must be below it).
    layers_per_type : int
        Layers run per layer type (they share the type's tile-scheduler holder).
    num_heads : int
        Attention query heads, 64 or 128.
    softmax_scale : float, optional
        Default ``512 ** -0.5``.
    decode_fn, logits_fn : callable, optional
        Stand-ins for FlashMLA's ``flash_mla_with_kvcache`` and DeepGEMM's
        ``fp8_paged_mqa_logits`` (CPU tests); default the libraries'.
    indexer_kwargs : dict, optional
        Passed to every :class:`IndexerTopKStep`.

    Attributes
    ----------
    indexers : dict of str to IndexerTopKStep
        By index type.
    q : bf16 ``(num_layers, max_decode_tokens, 1, H, 512)``
    attn_sink : fp32 ``(num_layers, H)``
    swa_cache : the window's MODEL1 cache (``swa_block_size`` tokens a page)
    caches : dict of str to MODEL1 cache
        Per top-k type, ``block_size // R`` entries a page.
    layers : list of ``(layer index, layer type)``
    out : bf16 ``(max_num_batched_tokens, num_layers, H, 512)``
    """

    def __init__(self, config: ArenaConfig, *, index_types: Sequence[str] | None = None,
                 num_kv_blocks: int = 4096, layers_per_type: int = 1, num_heads: int = 64,
                 softmax_scale: float | None = None, decode_fn: DecodeFn | None = None,
                 logits_fn: LogitsFn | None = None,
                 indexer_kwargs: dict[str, Any] | None = None) -> None:
        check_attention_config(config, num_heads)
        rows = {t.name: t for t in config.layer_types}
        names = list(index_types) if index_types is not None else [
            t.name for t in config.index_layer_types]
        not_topk = [n for n in names if n not in rows or rows[n].reads is not Reads.TOPK
                    or not rows[n].window]
        if not_topk:
            raise ConfigError(f"index_types {not_topk}: not windowed top-k layer types of this "
                              f"config ({[t.name for t in config.index_layer_types]})")
        self.indexers = {n: IndexerTopKStep(config, index_type=n, num_kv_blocks=num_kv_blocks,
                                            logits_fn=logits_fn, **(indexer_kwargs or {}))
                         for n in names}
        short = {n: s.topk for n, s in self.indexers.items() if s.topk != config.index_topk}
        if short:
            raise ConfigError(f"index types {sorted(short)} keep {sorted(set(short.values()))} "
                              f"keys, the layers take index_topk={config.index_topk} "
                              "(max_model_len too short for the top-k)")
        #: Whether ``decode_fn`` is FlashMLA's (its tile-scheduler holders are checked).
        self.checks_sched = decode_fn is None
        if decode_fn is None:
            decode_fn = require(FLASH_MLA).flash_mla_with_kvcache
        self.config, self.decode_fn, self.num_heads = config, decode_fn, num_heads
        self.scale = MODEL1_DIM ** -0.5 if softmax_scale is None else float(softmax_scale)
        types = [t.name for t in config.layer_types if t.window and t.reads is Reads.NONE]
        types += names
        self.layers, self.q, self.attn_sink, self.swa_cache = layer_buffers(
            config, types, layers_per_type, num_heads, num_kv_blocks)
        dev = config.torch_device
        self.caches = {name: alloc_model1_cache(
            num_kv_blocks, rows[name].entries_per_block(config.block_size), dev)
            for name in names}
        self.out = torch.zeros(config.max_num_batched_tokens, len(self.layers), num_heads,
                               MODEL1_DIM, dtype=torch.bfloat16, device=dev)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def __call__(self, batch: Batch, md: dict[str, Any]) -> dict[str, torch.Tensor]:
        swa, compressed = md["swa"], md["compressed"]
        topk = {n: step(batch, md) for n, step in self.indexers.items()}
        out = self.out[: batch.num_actual_tokens]
        td = swa.num_decode_tokens
        if td < out.shape[0]:
            out[td:].zero_()
        result = {f"topk.{n}": k for n, k in topk.items()}
        result["attn"] = out
        if td == 0:
            return result
        extra: dict[str, dict] = {}
        for name, rows in topk.items():
            idx, lens = compressed.decode_topk(name, rows)
            extra[name] = dict(extra_k_cache=self.caches[name],
                               extra_indices_in_kvcache=idx[:td], extra_topk_length=lens[:td])
        decode_layers(self, swa, {t: extra.get(t, {}) for _, t in self.layers}, out[:td])
        return result
