"""DeepSeek V4.1's ratio-2 compressor-ring links across PCP ranks, on the device
(``prefill-context-parallel.md`` §4.2, §8): graph-safe, ``R = 2 * max_num_seqs`` rows a rank.

Each row (gathered index ``rank * R + row``) gets the key ``(ring_block << 32) | last_pos``
(-1 when empty). vLLM all-gathers the keys; here every rank already holds every rank's rows,
so it builds all ``P * R`` keys itself and sorts them (a fixed-size sort). In sorted order a
key is its ring block's newest when the next key has another block; the newest row ending at
an even position leaves an open group, written to ``ring_block * Cap + pos % Cap``. A row
starting at an odd position links to the row whose key is ``(block, first_pos - 1)``
(``searchsorted``).

A request's ring block is column 0 of its row in the ring's own block table (the
``<type>.compressor_state`` group), the block the single-GPU compressed builder gives its
ring slots (:mod:`staticattn.kernels.compressed.kv_slots`), so a rank's saved rows land where
the single-GPU step's would. Worked example 4 of the spec (P = 4, q = (37, 100), ring blocks
A -> 5, B -> 9, R = 8): ``prev_row_indices`` rank 0 ``[-1, 9, -1, 11]`` (A[35, 37) starts at
odd 35; its group mate 34 ends rank 1's row 1, gathered row 9), and only gathered row 1 (A
ends at even 36) writes the ring, at ``5 * 8 + 36 % 8 = 44``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from staticattn.arena.buffers import BufferDecl
from staticattn.arena.groups import cache_groups
from staticattn.arena.pcp_config import PCPConfig
from staticattn.builders.pcp.rank_rows import RowViews
from staticattn.model import Cache

__all__ = ["RingLinks", "build_ring_links", "ring_buffers", "ring_table"]

#: The ratio whose compressor groups may straddle two ranks' chunks (two tokens a group).
_LINKED_RATIO = 2


@dataclass(slots=True)
class RingLinks:
    """The ring links of one rank's arena (views at fixed addresses) and where they come
    from.

    Attributes
    ----------
    prev_row_indices : int32 device ``(P, R)``
        Every rank's rows: the gathered row (``rank * R + row``) whose last token is the
        first half of the row's straddling group, else -1.
    ring_write_slots : int64 device ``(P * R,)``
        Per gathered row, the ring slot its last token is saved to (an open group), else -1.
    table : str
        The block table holding each request's ring block (column 0), a key of
        ``PCPViews.tables``: ``"block_tables.c2a.compressor_state"`` for V4.1.
    capacity : int
        ``Cap``, ring rows a request (8 without speculative decoding).
    """

    prev_row_indices: torch.Tensor
    ring_write_slots: torch.Tensor
    table: str
    capacity: int


def ring_table(config) -> str | None:
    """The block table of the ratio-2 compressor ring of an arena of ``config`` (an
    ArenaConfig), by its ``PCPViews.tables`` name; None when the model has none (V3.2)."""
    for group in cache_groups(config):
        if group.cache is Cache.COMPRESSOR_STATE \
                and group.layer_type.compress_ratio == _LINKED_RATIO:
            return f"block_tables.{group.name}"
    return None


def ring_buffers(cfg: PCPConfig) -> list[BufferDecl]:
    """The declarations of :class:`RingLinks`' views (``P`` ranks of ``R`` rows), -1 until
    the first step."""
    P, R = cfg.pcp_size, cfg.max_rows
    return [BufferDecl("pcp.ring.prev_row_indices", (P, R), torch.int32, fill=-1),
            BufferDecl("pcp.ring.ring_write_slots", (P * R,), torch.int64, fill=-1)]


def build_ring_links(rows: RowViews, num_computed: torch.Tensor, ring_block: torch.Tensor,
                     prev_row_indices: torch.Tensor, ring_write_slots: torch.Tensor,
                     ring_size: int = 8) -> None:
    """Write every rank's ``prev_row_indices`` and the ``ring_write_slots``.

    Parameters
    ----------
    rows : RowViews
        The batch's rows (P ranks, R rows each).
    num_computed, ring_block : int32 ``(S,)``
        Each request's computed tokens and ring block.
    prev_row_indices : int32 ``(P, R)``
        Out: the gathered row holding the first half of a row's straddling group, else -1.
    ring_write_slots : int64 ``(P * R,)``
        Out: the ring slot each gathered row's last token is saved to, else -1.
    ring_size : int
        Cap, the ring block's entries.
    """
    req, length = rows.row_req.long().flatten(), rows.row_len.long().flatten()
    first = num_computed.long()[req] + rows.row_offset.long().flatten()
    last = first + length - 1
    block = ring_block.long()[req]
    keys = torch.where(length > 0, (block << 32) | last, -1)
    sorted_keys, order = torch.sort(keys, stable=True)
    sorted_block = sorted_keys >> 32
    newest = torch.cat([sorted_block[1:] != sorted_block[:-1],
                        torch.ones_like(sorted_block[:1], dtype=torch.bool)])
    sorted_pos = sorted_keys & 0xFFFFFFFF
    write = torch.where((sorted_keys >= 0) & newest & (sorted_pos % 2 == 0),
                        sorted_block * ring_size + sorted_pos % ring_size, -1)
    ring_write_slots.scatter_(0, order, write)
    target = (block << 32) | (first - 1).clamp(min=0)
    at = torch.searchsorted(sorted_keys, target).clamp(max=keys.numel() - 1)
    found = (length > 0) & (first % 2 == 1) & (sorted_keys[at] == target)
    prev_row_indices.copy_(torch.where(found, order[at], -1).view_as(prev_row_indices))
