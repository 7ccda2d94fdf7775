"""The DeepSeek sparse-attention decode consumer: FlashMLA's sparse FP8 decode over the SWA
window plus each layer type's compressed keys, for several layers of every windowed type of
the config, with DeepGEMM's indexer top-k for the types that read one (spec §6.9,
``docs/spec/deepseek-v41.md`` §6-§7).

One step serves every model of the table: its per-type parts are built from the rows of the
config's windowed types (:class:`~staticattn.consumers.real.type_parts.LayerTypePart`), so
DeepSeek V4 is the case of one top-k type (``c4a``) beside a dense one (``c128a``) and
V4.1 that of two top-k types (``c1a``, ``c2a``). Per step, for the ``Td`` decode tokens of
``md["swa"]`` (each token is its own FlashMLA batch row with one query)::

    for t in top-k types:
        topk[t] = IndexerTopKStep(config, index_type=t)(batch, md)
    for every layer l of type t:
        out, lse = flash_mla_with_kvcache(
            q[l, :Td],                           # bf16 (Td, 1, H, 512)
            swa_cache, None, None, head_dim_v=512,
            tile_scheduler_metadata=md["swa"].tile_sched(t),   # one holder per type
            softmax_scale=..., is_fp8_kvcache=True,
            indices=md["swa"].decode_swa_indices, topk_length=md["swa"].decode_swa_lens,
            attn_sink=sink[l],
            **part[t].extra_keys(md, topk[t], Td))   # the dense or top-k keys; none else

and copies ``out`` into the step's own ``(max_num_batched_tokens, num_layers, H, 512)``
buffer.

Tile-scheduler metadata: the SWA builder makes one fresh holder per layer type inside
``build_decode``, so the first layer of a type runs FlashMLA's tile scheduler (inside a
capture: the scheduler kernel is recorded and runs again from the current lengths at every
replay) and the other layers of that type reuse its result.

What the SM90 kernels serve (the kit's DeepGEMM v2.6.1 and FlashMLA ``9241ae3``): FlashMLA
takes any page size for the window and the extra keys, a window that is a multiple of 64
and an extra top-k that is one; DeepGEMM's sm90 paged MQA logits read 64-entry index-K pages
only (:func:`~staticattn.consumers.real.indexer_topk.index_type_unserved`), so a top-k type
whose pages hold another count is left out (``topk_types=``) or is a
:class:`~staticattn.errors.ConfigError` naming the shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from staticattn.arena import ArenaConfig
from staticattn.builders.batch import Batch
from staticattn.consumers.real.caches import MODEL1_DIM, alloc_model1_cache
from staticattn.consumers.real.type_parts import LayerTypePart
from staticattn.errors import ConfigError, GraphError
from staticattn.kernels.runtime.dsa_libs import FLASH_MLA, require
from staticattn.model import Reads

__all__ = ["DecodeFn", "SparseDecodeStep", "check_attention_config", "check_sched"]

#: ``flash_mla_with_kvcache``'s signature.
DecodeFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]

#: FlashMLA's sparse decode works on blocks of 64 top-k entries (sm90 asserts it).
_TOPK_BLOCK = 64
_HEADS = (64, 128)


class SparseDecodeStep:
    """Step ``(batch, md) -> {"topk.<type>": int32 (T, K) per top-k type run, "attn": bf16
    (T, num_layers, H, 512)}``; the metadata of ``default_builders(config)`` (``md["swa"]``,
    each index type's indexer, ``md["compressed"]`` for the top-k types).

    Parameters
    ----------
    config : ArenaConfig
        DeepSeek V4-like: ``sliding_window`` set (a multiple of 64), ``swa_block_size``.
    topk_types : sequence of str, optional
        The windowed top-k types whose indexer and layers run; default all of the config's.
        ``()`` runs the window-only and dense layers alone (FlashMLA without DeepGEMM).
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
        Passed to every top-k type's :class:`IndexerTopKStep`.

    Attributes
    ----------
    parts : dict of str to LayerTypePart
        By layer type, the table's order.
    indexers : dict of str to IndexerTopKStep
        By top-k type.
    caches : dict of str to MODEL1 cache
        By type reading compressed entries, ``block_size // R`` entries a page.
    q : bf16 ``(num_layers, max_decode_tokens, 1, H, 512)``
    attn_sink : fp32 ``(num_layers, H)``
    swa_cache : the window's MODEL1 cache (``swa_block_size`` tokens a page)
    layers : list of ``(layer index, layer type)``
    out : bf16 ``(max_num_batched_tokens, num_layers, H, 512)``
    """

    def __init__(self, config: ArenaConfig, *, topk_types: Sequence[str] | None = None,
                 num_kv_blocks: int = 4096, layers_per_type: int = 2, num_heads: int = 64,
                 softmax_scale: float | None = None, decode_fn: DecodeFn | None = None,
                 logits_fn: Callable[..., torch.Tensor] | None = None,
                 indexer_kwargs: dict[str, Any] | None = None) -> None:
        check_attention_config(config, num_heads)
        #: Whether ``decode_fn`` is FlashMLA's (its tile-scheduler holders are checked).
        self.checks_sched = decode_fn is None
        if decode_fn is None:
            decode_fn = require(FLASH_MLA).flash_mla_with_kvcache
            if config.torch_device.type != "cuda":
                raise ConfigError("the FlashMLA attention step needs a CUDA arena config")
        rows = [t for t in config.layer_types if t.window]
        topk = _topk_types(config, rows, topk_types)
        kw = dict(indexer_kwargs or {})
        if logits_fn is not None:
            kw["logits_fn"] = logits_fn
        self.parts = {t.name: LayerTypePart(config, t, num_kv_blocks=num_kv_blocks,
                                            indexer_kwargs=kw)
                      for t in rows if t.reads is not Reads.TOPK or t.name in topk}
        self.indexers = {n: p.indexer for n, p in self.parts.items() if p.indexer is not None}
        short = {n: s.topk for n, s in self.indexers.items() if s.topk != config.index_topk}
        if short:
            raise ConfigError(f"index types {sorted(short)} keep {sorted(set(short.values()))} "
                              f"keys, the layers take index_topk={config.index_topk} "
                              "(max_model_len too short for the top-k)")
        self.caches = {n: p.cache for n, p in self.parts.items() if p.cache is not None}
        self.config, self.decode_fn, self.num_heads = config, decode_fn, num_heads
        self.scale = MODEL1_DIM ** -0.5 if softmax_scale is None else float(softmax_scale)
        self.layer_types = tuple(self.parts)
        # ``layers_per_type`` layers of each type, interleaved: (0, swaonly), (1, c4a), ...
        self.layers = sorted((i * len(self.parts) + j, t) for j, t in enumerate(self.parts)
                             for i in range(layers_per_type))
        dev, n = config.torch_device, len(self.layers)
        self.q = torch.zeros(n, config.max_decode_tokens, 1, num_heads, MODEL1_DIM,
                             dtype=torch.bfloat16, device=dev)
        self.attn_sink = torch.zeros(n, num_heads, dtype=torch.float32, device=dev)
        self.swa_cache = alloc_model1_cache(num_kv_blocks, config.swa_block_size, dev)
        self.out = torch.zeros(config.max_num_batched_tokens, n, num_heads, MODEL1_DIM,
                               dtype=torch.bfloat16, device=dev)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def __call__(self, batch: Batch, md: dict[str, Any]) -> dict[str, torch.Tensor]:
        swa = md["swa"]
        topk = {n: p.topk(batch, md) for n, p in self.parts.items()}
        out = self.out[: batch.num_actual_tokens]
        td = swa.num_decode_tokens
        if td < out.shape[0]:
            out[td:].zero_()
        result = {f"topk.{n}": k for n, k in topk.items() if k is not None}
        result["attn"] = out
        if td == 0:
            return result
        extra = {n: p.extra_keys(md, topk[n], td) for n, p in self.parts.items()}
        for layer, layer_type in self.layers:
            sched = swa.tile_sched(layer_type)
            if self.checks_sched:
                check_sched(sched, layer_type)
            o, _ = self.decode_fn(
                self.q[layer, :td], self.swa_cache, None, None, MODEL1_DIM, sched,
                softmax_scale=self.scale, is_fp8_kvcache=True,
                indices=swa.decode_swa_indices, attn_sink=self.attn_sink[layer],
                topk_length=swa.decode_swa_lens, **extra[layer_type],
            )
            out[:td, layer].copy_(o.view(td, self.num_heads, MODEL1_DIM))
        return result


def _topk_types(config: ArenaConfig, rows, names: Sequence[str] | None) -> list[str]:
    """The top-k types a step runs: ``names``, checked against the windowed top-k rows, or
    all of them; their top-k must fill FlashMLA's 64-entry blocks."""
    topk = [t.name for t in rows if t.reads is Reads.TOPK]
    names = topk if names is None else list(names)
    wrong = [n for n in names if n not in topk]
    if wrong:
        raise ConfigError(f"topk_types {wrong}: not windowed top-k layer types of this "
                          f"config ({topk})")
    if names and config.index_topk % _TOPK_BLOCK:
        raise ConfigError(f"index_topk={config.index_topk} must be a multiple of "
                          f"{_TOPK_BLOCK} for FlashMLA's top-k extra keys")
    return names


def check_attention_config(config: ArenaConfig, num_heads: int) -> None:
    """:class:`ConfigError` unless FlashMLA's sparse decode serves the config's window and
    ``num_heads`` query heads."""
    if config.sliding_window is None:
        raise ConfigError("the sparse attention step needs a DeepSeek V4-like config "
                          "(sliding_window set)")
    if config.sliding_window % _TOPK_BLOCK:
        raise ConfigError(f"sliding_window={config.sliding_window} must be a multiple of "
                          f"{_TOPK_BLOCK} (FlashMLA's sparse decode top-k block)")
    if num_heads not in _HEADS:
        raise ConfigError(f"num_heads={num_heads}: FlashMLA's sparse decode takes {_HEADS}")


def check_sched(sched: Any, layer_type: str) -> None:
    """:class:`GraphError` unless ``sched`` is FlashMLA's tile-scheduler holder."""
    if sched is None or type(sched).__name__ != "FlashMLASchedMeta":
        raise GraphError(
            f"md['swa'].tile_sched({layer_type!r}) is {type(sched).__name__}, not FlashMLA's "
            "FlashMLASchedMeta: the SWA builder made stand-in holders (flash_mla was not "
            "importable when staticattn.builders.swa.tile_scheduler first probed it)"
        )
