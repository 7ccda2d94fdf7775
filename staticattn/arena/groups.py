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

Under decode context parallelism (``dcp_world_size = W > 1``) the compressed KV and index-K
groups of a sharded type (:attr:`~staticattn.model.LayerType.dcp_sharded`) hold the rank's
local blocks: a column holds ``S`` of the rank's entries, which is a column's span of ``R S``
tokens on each of the ``W`` ranks, so ``cdiv(L, R S W)`` columns (with the interleave a
divisor of ``block_size``, the ``I // R`` entries a rank takes at a time divide ``S``, and a
rank's entries of a sequence never need more). The compressor ring is replicated: one column.
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
        ``max_model_len`` tokens (this rank's share of them under DCP).
    tokens_per_column : int
        The tokens of a sequence one column spans: ``R * S``, times ``dcp_world_size`` for a
        sharded cache under DCP; ``max_model_len`` for a ring, whose one column every
        request uses.
    """

    name: str
    layer_type: LayerType
    cache: Cache
    columns: int
    tokens_per_column: int


def _tokens_per_column(t: LayerType, cache: Cache, config: ArenaConfig) -> int:
    if cache is Cache.COMPRESSOR_STATE:
        return config.max_model_len
    span = max(t.compress_ratio, 1) * t.entries_per_block(config.block_size)
    return span * config.dcp_world_size if t.dcp_sharded else span


def _group(t: LayerType, cache: Cache, config: ArenaConfig) -> CacheGroup:
    span = _tokens_per_column(t, cache, config)
    columns = -(-config.max_model_len // span)  # a ring's span is max_model_len: one column
    return CacheGroup(t.group(cache), t, cache, columns, span)


def cache_groups(config: ArenaConfig) -> tuple[CacheGroup, ...]:
    """The groups of the config's layer types that own their caches' tables, in the table's
    type order and, per type, in :class:`Cache` order; empty for V3.2 and V4."""
    return tuple(
        _group(t, cache, config)
        for t in config.layer_types if t.addressing is Addressing.OWN_GROUPS
        for cache in Cache if cache in t.owns
    )
