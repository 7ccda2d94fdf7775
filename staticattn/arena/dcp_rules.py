"""The rules a config's decode-context-parallel fields must respect, checked once at
construction (:meth:`ArenaConfig.__post_init__`), each broken one a
:class:`~staticattn.errors.ConfigError` naming the field, its value and the rule.

With ``dcp_world_size = W > 1`` a sequence's tokens are dealt to the ranks in groups of
``I = cp_kv_cache_interleave_size`` (:mod:`staticattn.kernels.dcp.ownership`), and a sharded
cache's compressed entries follow their tokens, ``I // R`` entries at a time:

* ``I`` divides ``block_size``: a rank's local block holds whole interleave groups, so the
  ``I // R`` entries of a group never straddle two of its pages (a c2a page of
  ``block_size // 2`` entries takes whole groups of ``I // 2``);
* ``I`` is a multiple of every sharded compress ratio (the index-owning types' and the
  sharded types': ``dsa``, ``c4a``, ``c1a``, ``c2a``; not C128A's, whose entries are
  replicated): otherwise a compressed entry's tokens would live on two ranks -- c2a's entry
  ``k`` is written by the token at ``2k + 1``, so ``I = 1`` would put its two tokens on two
  ranks (the reference's indexer refuses the same, ``vllm-0.33-delta.md`` §4.1).
"""

from __future__ import annotations

from typing import Protocol

from staticattn.errors import ConfigError
from staticattn.model import LayerType

__all__ = ["DCPFields", "check_dcp"]


class DCPFields(Protocol):
    """What :func:`check_dcp` reads of an :class:`~staticattn.arena.ArenaConfig` (a
    protocol, so that this module needs no import of the config that calls it)."""

    dcp_world_size: int
    dcp_rank: int
    cp_kv_cache_interleave_size: int
    block_size: int

    @property
    def layer_types(self) -> tuple[LayerType, ...]: ...
    @property
    def index_layer_types(self) -> tuple[LayerType, ...]: ...
    @property
    def dcp_sharded_ratios(self) -> tuple[int, ...]: ...


def check_dcp(config: DCPFields) -> None:
    """Raise a :class:`ConfigError` for the first DCP rule ``config`` breaks (see the
    module); a config of one rank only needs ``dcp_rank = 0``."""
    world, rank = config.dcp_world_size, config.dcp_rank
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world:
        raise ConfigError(f"dcp_rank={rank!r} is outside [0, dcp_world_size={world})")
    if world == 1:
        return
    interleave = config.cp_kv_cache_interleave_size
    if config.block_size % interleave:
        raise ConfigError(
            f"cp_kv_cache_interleave_size={interleave} does not divide block_size="
            f"{config.block_size}: a rank's local block must hold whole interleave groups"
        )
    for r in config.dcp_sharded_ratios:
        if interleave % r:
            types = [t.name for t in config.layer_types
                     if t.compress_ratio == r and (t.dcp_sharded or t in config.index_layer_types)]
            raise ConfigError(
                f"cp_kv_cache_interleave_size={interleave} is not a multiple of the "
                f"sharded compress ratio {r} (layer types {types}): a compressed entry "
                "would straddle two ranks"
            )
