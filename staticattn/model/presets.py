"""Model families and presets, as data.

An architecture says how its checkpoints encode a layer's type: the per-layer
``compress_ratios`` of its config map to rows of :data:`~staticattn.model.layer_types.
LAYER_TYPES` through the architecture's encoding. The same number means different types in
different families, so the encoding belongs to the family, never to the number.

A preset is the set of :class:`~staticattn.arena.ArenaConfig` fields a model family is
served with -- its architecture, its layer pattern (one compress ratio per layer, in the
family's encoding), block sizes, window, top-k -- which ``ArenaConfig.preset(name)``
applies beneath the caller's overrides. Adding a model is adding a row here.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from staticattn.errors import ConfigError

__all__ = ["ARCHITECTURES", "Architecture", "ModelPreset", "PRESETS", "architecture",
           "model_preset"]


@dataclass(frozen=True, slots=True)
class Architecture:
    """A model family's encoding of layer types.

    Attributes
    ----------
    name : str
        The family ("deepseek_v4").
    encoding : mapping of int to str
        Compress ratio as the family's configs write it -> layer type name.
    bounded_replay : bool
        A prefix hit recomputes the last ``W`` tokens and every prefilling request carries
        a ``replay_start`` that clamps its sliding windows (``docs/spec/deepseek-v41.md``
        §8.1): the arena then has a per-request ``replay_start`` input.
    image_spans : bool
        Its vision variant sees image tokens bidirectionally inside a span
        (``vllm-0.33-extras.md`` §3): a config may set ``max_image_tokens``. DeepSeek V4
        only; V4.1's image tokens use the plain causal window (§3.1).
    """

    name: str
    encoding: MappingProxyType
    bounded_replay: bool = False
    image_spans: bool = False

    def layer_type_name(self, ratio: int, layer: int) -> str:
        """The type of layer ``layer`` whose config ratio is ``ratio``.

        Raises
        ------
        ConfigError
            A ratio the family does not encode, naming the layer.
        """
        try:
            return self.encoding[ratio]
        except (KeyError, TypeError):
            raise ConfigError(
                f"layer {layer}: compress ratio {ratio!r} is not a {self.name} layer type; "
                f"its encoding is {dict(self.encoding)}"
            ) from None


def _architecture(name: str, encoding: dict[int, str], *, bounded_replay: bool = False,
                  image_spans: bool = False) -> tuple[str, Architecture]:
    return name, Architecture(name, MappingProxyType(encoding), bounded_replay, image_spans)


#: Every model family, by name.
ARCHITECTURES: MappingProxyType = MappingProxyType(dict([
    # DeepSeek V3.2: every layer is a sparse MLA layer over the uncompressed cache.
    _architecture("deepseek_v32", {1: "dsa"}),
    # DeepSeek V4 (spec §6.1): ratio <= 1 is sliding-window only.
    _architecture("deepseek_v4", {0: "swaonly", 1: "swaonly", 4: "c4a", 128: "c128a"},
                  image_spans=True),
    # DeepSeek V4.1 (docs/spec/deepseek-v41.md §3.1): the same numbers mean other types;
    # prefix hits replay the last window (§8.1).
    _architecture("deepseek_v41", {0: "swaonly", 1: "c1a", 2: "c2a"}, bounded_replay=True),
]))

_V4 = dict(
    architecture="deepseek_v4", compress_ratios=(1, 4, 128), max_num_seqs=256,
    max_num_batched_tokens=8192, max_model_len=1048576, block_size=256,
    num_speculative_tokens=1, sliding_window=128, swa_block_size=64, index_topk=512,
)
#: DeepSeek-V4.1-Flash's layers (docs/spec/deepseek-v41.md §2.2): 2 SWA-only, 18 c2a, 20 c1a,
#: then 3 SWA-only DSpark/MTP layers.
_V41_FLASH_LAYERS = (0, 0) + (2,) * 18 + (1,) * 20 + (0, 0, 0)
_V41_FLASH = dict(
    architecture="deepseek_v41", compress_ratios=_V41_FLASH_LAYERS,
    kv_source_layers=(2, 8, 14, 20), index_source_layers=(2, 8, 14, 20, 24, 28, 32, 36),
    max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=1048576,
    # The compressed and index-K kernel block on SM90 (SM100 takes 128); SWA pages of 32.
    block_size=64, num_speculative_tokens=1, sliding_window=128, swa_block_size=32,
)


@dataclass(frozen=True, slots=True)
class ModelPreset:
    """A named set of arena fields.

    Attributes
    ----------
    name : str
        What ``ArenaConfig.preset`` and the command line take ("deepseek-v4").
    summary : str
        One line for listings and docstrings.
    fields : mapping of str to object
        The :class:`~staticattn.arena.ArenaConfig` fields it sets.
    """

    name: str
    summary: str
    fields: MappingProxyType


def _preset(name: str, summary: str, **fields: Any) -> tuple[str, ModelPreset]:
    return name, ModelPreset(name, summary, MappingProxyType(fields))


#: Every preset, by name.
PRESETS: MappingProxyType = MappingProxyType(dict([
    _preset(
        "deepseek-v3.2",
        "DeepSeek-V3.2-like: 160K context, 64-token blocks, sparse MLA layers over the "
        "uncompressed cache, top-2048.",
        architecture="deepseek_v32", compress_ratios=(1,), max_num_seqs=256,
        max_num_batched_tokens=8192, max_model_len=163840, block_size=64,
        num_speculative_tokens=0, sliding_window=None, index_topk=2048,
    ),
    _preset(
        "deepseek-v4",
        "DeepSeek-V4-like: 1M context, 256-token compressed blocks (C4A indexer storage 64 "
        "entries per block), SWA window 128 on 64-token blocks, one layer of each type "
        "(SWA-only, C4A, C128A), one MTP draft token (next_n = 2), top-512.",
        **_V4,
    ),
    _preset(
        "deepseek-v4-vision",
        "DeepSeek-V4's vision variant: the DeepSeek-V4-like preset with image spans of up to "
        "1024 tokens (prefill SWA rows W + 1024 wide), up to 64 spans per step.",
        **_V4, max_image_tokens=1024, max_image_spans=64,
    ),
    _preset(
        "deepseek-v4.1-flash",
        "DeepSeek-V4.1-Flash-like: 43 layers (SWA-only, c2a, c1a; kv sources 2, 8, 14, 20; "
        "index sources 2 .. 36), 1M context, window 128 on 32-token pages, 64-token compressed "
        "blocks, one draft token (next_n = 2), top-512 (prefill rows 640 wide).",
        **_V41_FLASH, index_topk=512,
    ),
    _preset(
        "deepseek-v4.1-large",
        "DeepSeek-V4.1-Flash's layers with top-1024 (prefill rows 1152 wide).",
        **_V41_FLASH, index_topk=1024,
    ),
]))


def architecture(name: str) -> Architecture:
    """The family ``name``; :class:`ConfigError` for an unknown one."""
    try:
        return ARCHITECTURES[name]
    except KeyError:
        raise ConfigError(
            f"architecture {name!r} is unknown; known: {sorted(ARCHITECTURES)}"
        ) from None


def model_preset(name: str) -> ModelPreset:
    """The preset ``name``; :class:`ConfigError` for an unknown one."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; known: {sorted(PRESETS)}") from None
