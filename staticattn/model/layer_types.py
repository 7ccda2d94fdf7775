"""The table of attention layer types: one row per type, read by everything that differs
per type (arena sizing, the builders' kernels as constexpr arguments, consumers, presets).

A DeepSeek sparse-attention model is a pattern of layers, each of one type. What a type
attends, what it owns and how wide its index rows are is data in its :class:`LayerType`
row; code that differs per type reads the row instead of branching on a name, so a new type
is a new row (plus, where a model family encodes it, an entry of its ratio encoding in
:mod:`staticattn.model.presets`).

=========  ===  ======  ========  ==========================================  ==========  ======
type       R    window  reads     owns (as a source layer)                    DCP         tables
=========  ===  ======  ========  ==========================================  ==========  ======
dsa        1    no      top-k     index K                                     sharded     main
swaonly    0    yes     --        --                                          --          --
c4a        4    yes     top-k     compressed KV, index K, compressor state    sharded     main
c128a      128  yes     all       compressed KV, compressor state             replicated  main
c1a        1    yes     top-k     compressed KV, index K                      sharded     own
c2a        2    yes     top-k     compressed KV, index K, compressor state    sharded     own
=========  ===  ======  ========  ==========================================  ==========  ======

``dsa`` is DeepSeek V3.2's sparse MLA layer: the indexer scores the uncompressed cache
(``R = 1``) and the layer attends its top-k. The DeepSeek V4 types (spec §6.1) attend their
sliding window, and C4A also the indexer's top-k of a 4x-compressed cache, C128A every
complete entry of a 128x-compressed cache. A token at position ``p`` has
``floor((p + 1) / R)`` complete compressed entries (:meth:`LayerType.compressed_entries`).
Each type has its own top-k shapes, so FlashMLA schedules its tiles per type
(:mod:`staticattn.builders.swa.tile_scheduler`).

DeepSeek V4.1's types (``docs/spec/deepseek-v41.md`` §3) are ``c1a``, a full-length
compressed cache (one entry per token, its own entry included: ``n_c(p) = p + 1``), and
``c2a``, one entry per pair of tokens written by the odd position. Both attend their window
and the indexer's top-k; they differ in the compressed page (``block_size // R`` entries),
hence separate tile-scheduler holders. Under V4.1 only *source* layers own caches; the
other layers of a type read the nearest source at or below them (:mod:`.sources`).
Each of their caches is a KV-cache group with its own block table (``addressing``, spec §4),
and a token whose own slot is -1 writes no compressed entry (``own_slot_gate``, spec §5.1).

Decode context parallelism (DCP column): a *sharded* type's compressed KV and index-K
entries are dealt over the ranks (each rank writes and reads its own, through its own block
tables), a *replicated* one's are held whole by every rank; the window and the compressor
state are replicated. vLLM 0.33 does not serve DeepSeek V4 or V4.1 under DCP: its indexer
raises for ``dcp > 1`` with ``R > 1`` under the ``deepseek_v4`` model version, its SWA builder
has no DCP code, and the V4.1 DCP work in progress lists the metadata localisation (SWA,
indexer, compressed slot mapping) as not done (``vllm-0.33-delta.md`` §4.1); only the slot
kernel already carries the localisation (``docs/spec/deepseek-v41.md`` §5.1). staticattn
serves c1a and c2a under DCP on purpose, the way it serves c4a and the way that work lays
the caches out (compressed and index caches sharded, window and compressor state
replicated): entries dealt at interleave ``I // R``, each cache group's table holding the
rank's local blocks (:mod:`staticattn.arena.groups`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from staticattn.errors import ConfigError

__all__ = ["Addressing", "Cache", "LAYER_TYPES", "LayerType", "Reads", "layer_type"]


class Reads(enum.Enum):
    """What a layer reads of the compressed entries, beside its window."""

    #: Nothing compressed: the sliding window only.
    NONE = "none"
    #: The indexer's top-k of the compressed entries (``index_topk`` of them at most).
    TOPK = "topk"
    #: Every complete compressed entry (no indexer).
    ALL = "all"


class Cache(enum.Enum):
    """The caches a source layer of a type owns (and the layers that share its source read)."""

    #: Compressed KV entries, one per ``R`` tokens.
    COMPRESSED_KV = "compressed_kv"
    #: The indexer's K entries, one per ``R`` tokens.
    INDEX_K = "index_k"
    #: The compressor's running state of the incomplete entry.
    COMPRESSOR_STATE = "compressor_state"


class Addressing(enum.Enum):
    """Through which block tables a source layer's caches are addressed."""

    #: The main cache group's one block table (``input.block_table``): DeepSeek V3.2's and
    #: V4's caches, ``block_size // R`` entries per block.
    MAIN_TABLE = "main_table"
    #: One KV-cache group, so one block table, per owned cache (DeepSeek V4.1,
    #: ``docs/spec/deepseek-v41.md`` §4): ``<type>.compressed_kv``, ``<type>.index_k``
    #: and ``<type>.compressor_state`` (a ring: one block per request).
    OWN_GROUPS = "own_groups"


@dataclass(frozen=True, slots=True)
class LayerType:
    """One row of the table.

    Attributes
    ----------
    name : str
        The type's name, as the reference engine spells it ("c4a").
    compress_ratio : int
        ``R``: uncompressed tokens per compressed entry; 0 when nothing is compressed.
    window : bool
        The layer attends a sliding window (``ArenaConfig.sliding_window``).
    reads : Reads
        What it reads of the compressed entries.
    owns : frozenset of Cache
        The caches a source layer of this type owns (``block_size // R`` entries per block,
        addressed as ``addressing`` says).
    dcp_sharded : bool
        Under decode context parallelism its compressed caches are dealt over the ranks (the
        indexer's and the top-k types'); otherwise every rank holds all of them.
    addressing : Addressing
        Whether the owned caches are addressed through the main block table or through a
        block table of their own each (:meth:`group`).
    own_slot_gate : bool
        A token whose own slot (the staged slot mapping) is -1 writes no compressed KV or
        index-K entry (vLLM 0.33's rule, ``docs/spec/deepseek-v41.md`` §5.1); without it
        the entry's slot follows from the position alone (v0.20.2's, for V4's types).
    """

    name: str
    compress_ratio: int
    window: bool
    reads: Reads
    owns: frozenset[Cache]
    dcp_sharded: bool
    addressing: Addressing = Addressing.MAIN_TABLE
    own_slot_gate: bool = False

    @property
    def compressed(self) -> bool:
        """Whether the layer reads compressed entries at all."""
        return self.reads is not Reads.NONE

    def compressed_entries(self, position: int) -> int:
        """``floor((p + 1) / R)``: the complete compressed entries at or before ``p`` (0
        before the first, and for a type without compression).

        >>> LAYER_TYPES["c4a"].compressed_entries(7), LAYER_TYPES["c4a"].compressed_entries(6)
        (2, 1)
        """
        if not self.compress_ratio:
            return 0
        return max(position + 1, 0) // self.compress_ratio

    def group(self, cache: Cache) -> str:
        """The name of the cache group (and block table) of ``cache`` under
        :attr:`Addressing.OWN_GROUPS`: ``"c2a.index_k"``."""
        return f"{self.name}.{cache.value}"

    def entries_per_block(self, block_size: int) -> int:
        """Compressed entries per block of ``block_size`` tokens (at least 1)."""
        return max(block_size // max(self.compress_ratio, 1), 1)

    def topk_width(self, index_topk: int, max_model_len: int) -> int:
        """Width of one token's row of compressed indices: ``index_topk`` for a top-k type,
        ``round_up(cdiv(max_model_len, R), 128)`` for a type reading every entry (FlashMLA's
        sparse decode needs a multiple of 128), 0 without compression."""
        if self.reads is Reads.TOPK:
            return index_topk
        if self.reads is Reads.ALL:
            entries = -(-max_model_len // self.compress_ratio)
            return -(-entries // 128) * 128
        return 0


def _row(name: str, ratio: int, window: bool, reads: Reads, owns: tuple[Cache, ...],
         dcp_sharded: bool, **fields) -> tuple[str, LayerType]:
    return name, LayerType(name, ratio, window, reads, frozenset(owns), dcp_sharded, **fields)


_KV, _IDX, _STATE = Cache.COMPRESSED_KV, Cache.INDEX_K, Cache.COMPRESSOR_STATE
#: DeepSeek V4.1's types (vLLM 0.33): a cache group per owned cache, and the own-slot rule.
_V41 = dict(addressing=Addressing.OWN_GROUPS, own_slot_gate=True)

#: Every layer type, in a fixed order (the order of every per-type output).
LAYER_TYPES: dict[str, LayerType] = dict([
    _row("dsa", 1, False, Reads.TOPK, (_IDX,), True),
    _row("swaonly", 0, True, Reads.NONE, (), False),
    _row("c4a", 4, True, Reads.TOPK, (_KV, _IDX, _STATE), True),
    _row("c128a", 128, True, Reads.ALL, (_KV, _STATE), False),
    _row("c1a", 1, True, Reads.TOPK, (_KV, _IDX), True, **_V41),
    _row("c2a", 2, True, Reads.TOPK, (_KV, _IDX, _STATE), True, **_V41),
])


def layer_type(name: str) -> LayerType:
    """The row of ``name``.

    Raises
    ------
    ConfigError
        For a name the table does not hold.
    """
    try:
        return LAYER_TYPES[name]
    except KeyError:
        raise ConfigError(
            f"layer type {name!r} is not in the table; known: {list(LAYER_TYPES)}"
        ) from None
