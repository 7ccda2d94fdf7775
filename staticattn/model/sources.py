"""Source layers: which layers own the compressed caches, and which run the indexer.

DeepSeek V4.1 shares caches across layers (``docs/spec/deepseek-v41.md`` §2): only the
*kv-source* layers own a compressed cache (and its index-K cache and compressor), only the
*index-source* layers run the indexer, and every other compressed layer reads the nearest
source at or below it. A model without source lists (V3.2, V4) is the special case where
every compressed layer is its own source.

Example, DeepSeek-V4.1-Flash (spec §2.2): kv sources ``[2, 8, 14, 20]`` give c2a layers
2-7 layer 2's cache, 8-13 layer 8's, 14-19 layer 14's and c1a layers 20-39 layer 20's; index
sources ``[2, 8, 14, 20, 24, 28, 32, 36]`` give layers 21-23 layer 20's top-k and 25-27
layer 24's, and index source 24 reads layer 20's index-K cache.

:func:`resolve_sources` checks the lists against the layer pattern and raises a
:class:`~staticattn.errors.ConfigError` that names the layer and the rule it breaks.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from staticattn.errors import ConfigError
from staticattn.model.layer_types import Cache, LayerType

__all__ = ["LayerSources", "resolve_sources"]


@dataclass(frozen=True, slots=True)
class LayerSources:
    """Per layer, the layer whose caches it reads (None: it reads nothing compressed).

    Attributes
    ----------
    kv_source : tuple of (int or None)
        The layer owning the compressed KV cache each layer reads.
    index_source : tuple of (int or None)
        The layer whose indexer top-k each top-k layer reads.
    kv_sources, index_sources : tuple of int
        The source layers themselves, ascending.
    """

    kv_source: tuple[int | None, ...]
    index_source: tuple[int | None, ...]
    kv_sources: tuple[int, ...]
    index_sources: tuple[int, ...]


def _check_list(name: str, layers: Sequence[int], num_layers: int) -> tuple[int, ...]:
    out = tuple(layers)
    for i, layer in enumerate(out):
        if type(layer) is not int or not 0 <= layer < num_layers:
            raise ConfigError(f"{name}[{i}] = {layer!r} is not a layer of the model "
                              f"(0 .. {num_layers - 1})")
        if i and layer <= out[i - 1]:
            raise ConfigError(f"{name} must be strictly increasing; {out[i - 1]} is followed "
                              f"by {layer}")
    return out


def _nearest(sources: tuple[int, ...], layer: int) -> int | None:
    i = bisect.bisect_right(sources, layer)
    return sources[i - 1] if i else None


def resolve_sources(types: Sequence[LayerType], kv_sources: Sequence[int] | None,
                    index_sources: Sequence[int] | None) -> LayerSources:
    """Check the source lists against the per-layer ``types`` and give each layer its
    sources.

    Rules (each a :class:`ConfigError` naming the layer): the lists are strictly increasing
    layer numbers; a kv source's type owns a compressed KV cache, an index source's an index
    cache; every compressed layer has a kv source at or below it, and every top-k layer an
    index source, and the nearest one is of its own type (a layer reads pages of its own
    ratio). ``None`` for a list: every layer that could be such a source is one.
    """
    n = len(types)
    # The layers that read a source's caches: those of a type whose sources own them.
    compressed = tuple(i for i, t in enumerate(types) if Cache.COMPRESSED_KV in t.owns)
    topk = tuple(i for i, t in enumerate(types) if Cache.INDEX_K in t.owns)
    kv = compressed if kv_sources is None else _check_list("kv_source_layers", kv_sources, n)
    idx = topk if index_sources is None else _check_list("index_source_layers",
                                                         index_sources, n)
    for name, layers, cache in (("kv_source_layers", kv, Cache.COMPRESSED_KV),
                                ("index_source_layers", idx, Cache.INDEX_K)):
        for layer in layers:
            if cache not in types[layer].owns:
                raise ConfigError(f"{name}: layer {layer} is {types[layer].name}, which owns "
                                  f"no {cache.value} cache")
    kv_of = [None] * n
    idx_of = [None] * n
    for layer in compressed:
        kv_of[layer] = _nearest_of_type("kv", kv, types, layer)
    for layer in topk:
        idx_of[layer] = _nearest_of_type("index", idx, types, layer)
    return LayerSources(tuple(kv_of), tuple(idx_of), kv, idx)


def _nearest_of_type(kind: str, sources: tuple[int, ...], types: Sequence[LayerType],
                     layer: int) -> int:
    source = _nearest(sources, layer)
    if source is None:
        raise ConfigError(f"layer {layer} ({types[layer].name}) has no {kind} source at or "
                          f"below it: every compressed layer reads the nearest {kind} source "
                          "at or below it")
    if types[source] != types[layer]:
        raise ConfigError(f"layer {layer} ({types[layer].name}) would read {kind} source "
                          f"{source} ({types[source].name}): the nearest {kind} source at or "
                          "below a layer must be of its type")
    return source
