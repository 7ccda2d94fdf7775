"""Oracle of one rank's share of the decode rows under decode context parallelism
(``vllm-0.33-extras.md`` §7.2), plain loops from the block tables.

* SWA: a decode token at ``p`` attends positions ``[max(p - W + 1, 0), p]``; rank ``r``
  keeps those it owns (``(x // I) % world == r``), ascending, at their (replicated) SWA
  slots ``bt[x // bs] * bs + x % bs``.
* The dense type (C128A): entries ``e < n_c = min((p + 1) // 128, maxC)``; rank ``r``
  keeps those it owns (``e % world == r``), ascending, at their local slots: local index
  ``l = e // world``, slot ``bt[l // S] * S + l % S``.

An invalid token has no share on any rank. The writer of the dense layout: the token at
``p`` with ``(p + 1) % 128 == 0`` completes entry ``e = p // 128`` and writes it only on
rank ``e % world``, at the local slot of ``e // world``.
"""

from __future__ import annotations

__all__ = ["dense_share", "dense_write_slot", "swa_share"]


def swa_share(position: int, window: int, block_row, block_size: int, world: int, rank: int,
              interleave: int = 1) -> list[int]:
    """The rank's SWA slots of a decode token at ``position``."""
    out = []
    for x in range(max(position - window + 1, 0), position + 1):
        if (x // interleave) % world == rank:
            out.append(int(block_row[x // block_size]) * block_size + x % block_size)
    return out


def dense_share(position: int, max_entries: int, block_row, entries_per_block: int,
                world: int, rank: int, ratio: int = 128) -> list[int]:
    """The rank's dense local slots of a decode token at ``position``."""
    out = []
    for e in range(min((position + 1) // ratio, max_entries)):
        if e % world == rank:
            local = e // world
            page = int(block_row[local // entries_per_block])
            out.append(page * entries_per_block + local % entries_per_block)
    return out


def dense_write_slot(position: int, block_row, entries_per_block: int, world: int, rank: int,
                     ratio: int = 128) -> int:
    """The local slot the token at ``position`` writes its completed entry to on ``rank``,
    -1 when it completes none or the entry is another rank's."""
    if (position + 1) % ratio != 0:
        return -1
    e = position // ratio
    if e % world != rank:
        return -1
    local = e // world
    return int(block_row[local // entries_per_block]) * entries_per_block + (
        local % entries_per_block)
