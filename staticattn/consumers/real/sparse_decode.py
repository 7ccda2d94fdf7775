"""The DeepSeek V4 sparse attention decode consumer: FlashMLA's sparse FP8 decode over the SWA
window plus each layer type's compressed keys, for several layers (spec §6.9).

Per step, for the ``Td`` decode tokens of ``md["swa"]`` (each token is its own FlashMLA batch
row with one query), and for every layer ``l`` of every layer type::

    out, lse = flash_mla_with_kvcache(
        q[l, :Td],                           # bf16 (Td, 1, H, 512)
        swa_cache, None, None, head_dim_v=512,
        tile_scheduler_metadata=md["swa"].tile_sched(layer_type),
        softmax_scale=..., is_fp8_kvcache=True,
        indices=md["swa"].decode_swa_indices, topk_length=md["swa"].decode_swa_lens,
        attn_sink=sink[l],
        extra_k_cache=...,                   # C4A / dense layers only
        extra_indices_in_kvcache=..., extra_topk_length=...)

and copies ``out`` into the step's own ``(max_num_batched_tokens, num_layers, H, 512)``
buffer. The extra keys:

* C128A: ``md["swa"].dense_decode_indices`` / ``dense_decode_lens`` over the dense cache
  (``block_size // 128`` entries per page);
* C4A: the indexer's top-k (local compressed indices, a valid prefix then -1), turned into
  flat slots of the C4A cache as the reference does
  (``compute_global_topk_indices_and_lens``): ``slot = block_table[b, k // S] * S + k % S``,
  length = ``count(k >= 0)``, 0 for invalid tokens; written into owned buffers.

Tile-scheduler metadata: the SWA builder makes one fresh holder per layer type inside
``build_decode``, so the first layer of a type runs FlashMLA's tile scheduler (inside a
capture: the scheduler kernel is recorded and runs again from the current lengths at every
replay) and the other layers of that type reuse its result.

Caches (owned, MODEL1 layout, :mod:`staticattn.consumers.real.caches`): one SWA cache
(``swa_block_size`` tokens per page) shared by all layers, one per compressed type. A real
model has one per layer; sharing them keeps the test light and changes nothing the kernel sees.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from staticattn.arena import ArenaConfig
from staticattn.builders.batch import Batch
from staticattn.consumers.real.caches import MODEL1_DIM, alloc_model1_cache
from staticattn.errors import ConfigError, GraphError
from staticattn.kernels.runtime.dsa_libs import FLASH_MLA, require
from staticattn.model import Reads

__all__ = ["DecodeFn", "SparseDecodeStep", "check_attention_config", "check_sched",
           "decode_layers", "layer_buffers"]

#: ``flash_mla_with_kvcache``'s signature.
DecodeFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]

#: FlashMLA's sparse decode works on blocks of 64 top-k entries (sm90 asserts it).
_TOPK_BLOCK = 64
_HEADS = (64, 128)


class SparseDecodeStep:
    """Step ``(batch, md, c4a_topk=None) -> bf16 (num_tokens, num_layers, H, 512)``.

    Parameters
    ----------
    config : ArenaConfig
        DeepSeek V4-like: ``sliding_window`` set (a multiple of 64), ``swa_block_size``.
    layers_per_type : int
        Layers run per layer type (all share the type's tile-scheduler metadata).
    layer_types : sequence of str, optional
        Default: the config's types, C4A only when ``with_c4a``.
    with_c4a : bool
        Run C4A layers; then every call needs ``c4a_topk`` (the indexer's top-k).
    num_heads : int
        Query heads, 64 or 128.
    num_kv_blocks : int
        Blocks of each owned cache (block ids of the batch must be below it).
    softmax_scale : float, optional
        Default ``512 ** -0.5``.
    decode_fn : callable, optional
        Stand-in for ``flash_mla.flash_mla_with_kvcache`` (CPU tests); default FlashMLA's.

    Attributes
    ----------
    q : bf16 ``(num_layers, max_decode_tokens, 1, H, 512)``
    attn_sink : fp32 ``(num_layers, H)``
    swa_cache, c4a_cache, dense_cache : MODEL1 caches (the latter two None when unused)
    layers : list of ``(layer index, layer type)``
    out : bf16 ``(max_num_batched_tokens, num_layers, H, 512)``
    """

    def __init__(
        self,
        config: ArenaConfig,
        *,
        layers_per_type: int = 2,
        layer_types: Sequence[str] | None = None,
        with_c4a: bool = False,
        num_heads: int = 64,
        num_kv_blocks: int = 4096,
        softmax_scale: float | None = None,
        decode_fn: DecodeFn | None = None,
    ) -> None:
        check_attention_config(config, num_heads)
        present = {t.name: t for t in config.layer_types if t.window}
        if layer_types is None:
            layer_types = [n for n, t in present.items() if t.reads is not Reads.TOPK or with_c4a]
        unknown = [n for n in layer_types if n not in present]
        topk = [n for n in layer_types if n in present and present[n].reads is Reads.TOPK]
        if unknown or (topk and not with_c4a):
            raise ConfigError(
                f"layer types {list(layer_types)}: the config has {list(present)}, and C4A "
                "layers need with_c4a=True (their keys come from the indexer's top-k)"
            )
        #: What each layer type reads beside its window, from the table.
        self.reads = {n: present[n].reads for n in layer_types}
        #: Whether ``decode_fn`` is FlashMLA's (its tile-scheduler holders are checked).
        self.checks_sched = decode_fn is None
        if decode_fn is None:
            decode_fn = require(FLASH_MLA).flash_mla_with_kvcache
            if config.torch_device.type != "cuda":
                raise ConfigError("the FlashMLA attention step needs a CUDA arena config")
        self.config = config
        self.decode_fn = decode_fn
        self.num_heads = num_heads
        self.scale = MODEL1_DIM ** -0.5 if softmax_scale is None else float(softmax_scale)
        self.layer_types = tuple(layer_types)
        self.layers, self.q, self.attn_sink, self.swa_cache = layer_buffers(
            config, layer_types, layers_per_type, num_heads, num_kv_blocks)
        dev = config.torch_device
        rows, n = config.max_decode_tokens, len(self.layers)
        dense = config.dense_layer_type
        self.dense_cache = (alloc_model1_cache(num_kv_blocks,
                                               dense.entries_per_block(config.block_size), dev)
                            if dense is not None and dense.name in layer_types else None)
        self.c4a_cache = None
        if topk:
            k = config.index_topk
            if k % _TOPK_BLOCK:
                raise ConfigError(f"index_topk={k} must be a multiple of {_TOPK_BLOCK} for "
                                  "FlashMLA's C4A extra keys")
            self.c4a_cache = alloc_model1_cache(num_kv_blocks, config.storage_block_size, dev)
            self._c4a_indices = torch.full((rows, 1, k), -1, dtype=torch.int32, device=dev)
            self._c4a_lens = torch.zeros(rows, dtype=torch.int32, device=dev)
            self._c4a_valid = torch.empty(rows, k, dtype=torch.bool, device=dev)
            self._minus_one = torch.tensor(-1, dtype=torch.int32, device=dev)
        self.out = torch.zeros(config.max_num_batched_tokens, n, num_heads, MODEL1_DIM,
                               dtype=torch.bfloat16, device=dev)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def __call__(self, batch: Batch, md: dict[str, Any],
                 c4a_topk: torch.Tensor | None = None) -> torch.Tensor:
        swa = md["swa"]
        out = self.out[: batch.num_actual_tokens]
        td = swa.num_decode_tokens
        if self.c4a_cache is not None and td:
            if c4a_topk is None:
                raise GraphError("this step runs C4A layers: pass c4a_topk, the indexer's "
                                 "(num_tokens, index_topk) top-k")
            if c4a_topk.shape[-1] != self._c4a_indices.shape[-1]:
                raise GraphError(f"c4a_topk has {c4a_topk.shape[-1]} columns; the C4A layers "
                                 f"take index_topk={self._c4a_indices.shape[-1]}")
        # Checked first, written after: a rejected call leaves the output as it was.
        if td < out.shape[0]:
            out[td:].zero_()
        if td == 0:
            return out
        extra = {Reads.NONE: {}}
        if self.dense_cache is not None:
            extra[Reads.ALL] = dict(extra_k_cache=self.dense_cache,
                                    extra_indices_in_kvcache=swa.dense_decode_indices,
                                    extra_topk_length=swa.dense_decode_lens)
        if self.c4a_cache is not None:
            idx, lens = self._c4a_slots(batch, swa, c4a_topk[:td])
            extra[Reads.TOPK] = dict(extra_k_cache=self.c4a_cache, extra_indices_in_kvcache=idx,
                                     extra_topk_length=lens)
        decode_layers(self, swa, {t: extra[r] for t, r in self.reads.items()}, out[:td])
        return out

    def _c4a_slots(self, batch: Batch, swa, topk: torch.Tensor):
        """The indexer's local top-k -> flat C4A slots and lengths, in owned buffers."""
        td = topk.shape[0]
        s = self.config.storage_block_size
        valid = self._c4a_valid[:td]
        torch.ge(topk, 0, out=valid)
        local = topk.clamp(min=0)
        req = swa.token_to_req_indices[:td].long().unsqueeze(1)
        blocks = batch.block_table[req, torch.div(local, s, rounding_mode="floor").long()]
        idx = self._c4a_indices[:td]
        torch.where(valid, blocks * s + local % s, self._minus_one, out=idx[:, 0])
        lens = self._c4a_lens[:td]
        torch.sum(valid, dim=1, dtype=torch.int32, out=lens)
        lens.mul_(swa.is_valid_token[:td])
        return idx, lens


def layer_buffers(config: ArenaConfig, layer_types: Sequence[str], layers_per_type: int,
                  num_heads: int, num_kv_blocks: int):
    """``(layers, q, attn_sink, swa_cache)`` of an attention step: ``layers_per_type``
    layers of each type interleaved as ``(layer index, type)``, their queries bf16
    ``(num_layers, max_decode_tokens, 1, H, 512)``, sinks fp32 ``(num_layers, H)``, and the
    window's MODEL1 cache (``swa_block_size`` tokens a page)."""
    layers = sorted((i * len(layer_types) + j, t) for j, t in enumerate(layer_types)
                    for i in range(layers_per_type))
    dev = config.torch_device
    q = torch.zeros(len(layers), config.max_decode_tokens, 1, num_heads, MODEL1_DIM,
                    dtype=torch.bfloat16, device=dev)
    attn_sink = torch.zeros(len(layers), num_heads, dtype=torch.float32, device=dev)
    return layers, q, attn_sink, alloc_model1_cache(num_kv_blocks, config.swa_block_size, dev)


def decode_layers(step, swa, extra: dict[str, dict], out: torch.Tensor) -> None:
    """Run every layer of ``step`` through its ``decode_fn`` and copy each result into
    ``out[:, layer]`` (bf16 ``(Td, num_layers, H, 512)``): the window of ``swa`` (the SWA
    metadata) over ``step.swa_cache``, the layer type's tile-scheduler holder, and the
    type's extra keys (``extra[type]``: FlashMLA's ``extra_*`` keywords, empty for a
    window-only type). ``step`` offers ``layers``, ``q``, ``attn_sink``, ``swa_cache``,
    ``scale``, ``num_heads``, ``decode_fn`` and whether it is the real library
    (``checks_sched``)."""
    td = out.shape[0]
    for layer, layer_type in step.layers:
        sched = swa.tile_sched(layer_type)
        if step.checks_sched:
            check_sched(sched, layer_type)
        o, _ = step.decode_fn(
            step.q[layer, :td], step.swa_cache, None, None, MODEL1_DIM, sched,
            softmax_scale=step.scale, is_fp8_kvcache=True,
            indices=swa.decode_swa_indices, attn_sink=step.attn_sink[layer],
            topk_length=swa.decode_swa_lens, **extra[layer_type],
        )
        out[:, layer].copy_(o.view(td, step.num_heads, MODEL1_DIM))


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
