"""DeepSeek V4.1's ratio-2 compressor-ring links across PCP ranks, on the device
(``prefill-context-parallel.md`` §4.2, §8): graph-safe, ``R = 2 * max_num_seqs`` rows a rank.

Each row (gathered index ``rank * R + row``) gets the key ``(ring_block << 32) | last_pos``
(-1 when empty). vLLM all-gathers the keys; here every rank already holds every rank's rows,
so it builds all ``P * R`` keys itself and sorts them (a fixed-size sort). In sorted order a
key is its ring block's newest when the next key has another block; the newest row ending at
an even position leaves an open group, written to ``ring_block * Cap + pos % Cap``. A row
starting at an odd position links to the row whose key is ``(block, first_pos - 1)``
(``searchsorted``).
"""

from __future__ import annotations

import torch

from staticattn.builders.pcp.rank_rows import RowViews

__all__ = ["build_ring_links"]


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
