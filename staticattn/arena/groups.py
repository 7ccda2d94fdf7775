"""The KV-cache groups whose block tables an arena holds besides the main and SWA ones.

The reference engine keeps one KV-cache group, hence one block table, per cache spec
(``docs/spec/deepseek-v41.md`` §4). DeepSeek V3.2's and V4's caches are all addressed through
the main table (``input.block_table``); a layer type whose row says
:attr:`~staticattn.model.Addressing.OWN_GROUPS` (DeepSeek V4.1's ``c1a``, ``c2a``) has one
group per cache it owns, named ``"<type>.<cache>"``:

============================  ======================================  ==========================
group                         a column holds                          columns
============================  ======================================  ==========================
``<type>.compressed_kv``      ``S = block_size // R`` entries         ``cdiv(cdiv(L, R), S)``
``<type>.index_k``            ``S`` index-K entries                   ``cdiv(cdiv(L, R), S)``
``<type>.compressor_state``   the request's ring block (spec §5.3)    1
============================  ======================================  ==========================

(``L = max_model_len``). Example, DeepSeek-V4.1-Flash: ``c1a.compressed_kv``,
``c1a.index_k``, ``c2a.compressed_kv``, ``c2a.index_k``, ``c2a.compressor_state``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from staticattn.model import Addressing, Cache, LayerType

if TYPE_CHECKING:
    from staticattn.arena.config import ArenaConfig

__all__ = ["CacheGroup", "cache_groups"]


@dataclass(frozen=True, slots=True)
class CacheGroup:
    """One KV-cache group with its own block table.

    Attributes
    ----------
    name : str
        ``"<type>.<cache>"`` (:meth:`LayerType.group`); the table is
        ``StepInputs.block_tables[name]``.
    layer_type : LayerType
        The type whose source layers own the cache.
    cache : Cache
        Which of its caches.
    columns : int
        Columns of the block table: 1 for a compressor ring, else enough blocks for
        ``max_model_len`` tokens.
    """

    name: str
    layer_type: LayerType
    cache: Cache
    columns: int


def _columns(t: LayerType, cache: Cache, config: ArenaConfig) -> int:
    if cache is Cache.COMPRESSOR_STATE:
        return 1
    entries = -(-config.max_model_len // max(t.compress_ratio, 1))
    return -(-entries // t.entries_per_block(config.block_size))


def cache_groups(config: ArenaConfig) -> tuple[CacheGroup, ...]:
    """The groups of the config's layer types that own their caches' tables, in the table's
    type order and, per type, in :class:`Cache` order; empty for V3.2 and V4."""
    return tuple(
        CacheGroup(t.group(cache), t, cache, _columns(t, cache, config))
        for t in config.layer_types if t.addressing is Addressing.OWN_GROUPS
        for cache in Cache if cache in t.owns
    )
