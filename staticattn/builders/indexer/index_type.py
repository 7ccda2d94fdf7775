"""Which layer type an indexer serves, and what its row says about the index-K cache.

A model has at most one index-owning type in DeepSeek V3.2 (``dsa``) and V4 (``c4a``), and two
in DeepSeek V4.1 (``c1a``, ``c2a``; ``docs/spec/deepseek-v41.md`` §4-§6), each served by its
own :class:`~staticattn.builders.indexer.builder.IndexerMetadataBuilder`. Everything that
differs between them is read from the type's row here: the compress ratio ``R``, the entries
per block ``S = block_size // R``, the block table the index K is addressed through (the main
one, or the type's ``<type>.index_k`` group) and whether a token whose own slot is -1 writes
no entry.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from staticattn.arena import ArenaConfig, cache_groups
from staticattn.builders.batch import Batch
from staticattn.errors import ConfigError
from staticattn.kernels.compressed.slot_gate import SlotGate
from staticattn.kernels.dcp.ownership import DCPShard
from staticattn.model import Addressing, Cache, LayerType, layer_type

__all__ = ["IndexType", "index_type", "indexer_name"]


class IndexType(NamedTuple):
    """The index-K facts of the type an indexer serves.

    Attributes
    ----------
    row : LayerType or None
        The type (None: a model without an index-owning type; ratio 1, the main table).
    compress_ratio : int
        ``R``.
    storage_block_size : int
        ``S = block_size // R`` index-K entries per block.
    table_columns : int
        Columns of the block table the index K is addressed through.
    own_slot_gate : bool
        A token whose own (staged) slot is -1 writes no index-K entry (V4.1).
    own_table : bool
        The index K has its own cache group and table (V4.1), so its slots are always
        computed from that table, even with ``R = 1``.
    """

    row: LayerType | None
    compress_ratio: int
    storage_block_size: int
    table_columns: int
    own_slot_gate: bool
    own_table: bool

    def table(self, batch: Batch) -> torch.Tensor:
        """The block table of the index K, int32 device ``(num_reqs, table_columns)``."""
        if self.row is None:
            return batch.block_table
        return batch.table_of(self.row, Cache.INDEX_K)

    def slot_gate(self, batch: Batch, window: int) -> SlotGate | None:
        """The gate of the computed slots: with the own-slot rule the staged slot mapping
        and the batch's replay starts (``window`` the replayed span); else None."""
        if not self.own_slot_gate:
            return None
        return SlotGate(batch.slot_mapping, batch.replay_start, window)

    def computes_slots(self, config: ArenaConfig) -> bool:
        """Whether the slot mapping is computed (compressed, own table, or the rank's own
        entries under DCP) rather than the staged one."""
        return self.compress_ratio > 1 or self.own_table or config.dcp_world_size > 1

    def dcp_shard(self, config: ArenaConfig) -> DCPShard | None:
        """This rank's shard of the index-K entries (interleave ``I // R``), None without DCP."""
        if config.dcp_world_size == 1:
            return None
        return DCPShard(config.dcp_world_size, config.dcp_rank,
                        config.dcp_entry_interleave(self.compress_ratio))


def index_type(config: ArenaConfig, name: str | None) -> IndexType:
    """The index-K facts of type ``name``, or of the config's one index-owning type when
    ``name`` is None.

    Raises
    ------
    ConfigError
        ``name`` is None and several types own an index cache, or ``name`` owns none in this
        config.
    """
    if name is None:
        row = config.index_layer_type
    else:
        row = layer_type(name)
        if row not in config.index_layer_types:
            raise ConfigError(
                f"layer type {name!r} owns no index cache in this config; index-owning types: "
                f"{[t.name for t in config.index_layer_types]}"
            )
    if row is None:
        return IndexType(None, 1, config.block_size, config.max_blocks_per_req, False, False)
    ratio = max(row.compress_ratio, 1)
    own = row.addressing is Addressing.OWN_GROUPS
    columns = (next(g.columns for g in cache_groups(config) if g.name == row.group(Cache.INDEX_K))
               if own else config.max_blocks_per_req)
    return IndexType(row, ratio, row.entries_per_block(config.block_size), columns,
                     row.own_slot_gate, own)


def indexer_name(config: ArenaConfig, row: LayerType) -> str:
    """The metadata key of the indexer serving the index type ``row`` among
    ``default_builders(config)``: ``"indexer"`` when the config has one index-owning type
    (DeepSeek V3.2, V4), ``"indexer.<type>"`` each when it has several (V4.1)."""
    return "indexer" if len(config.index_layer_types) == 1 else f"indexer.{row.name}"
