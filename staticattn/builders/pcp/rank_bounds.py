"""A rank's host-side bounds and the de-interleaving gather, on the device
(``prefill-context-parallel.md`` §3.1, §3.5): graph-safe, capacity-shaped.

``logits_indices = query_start_loc[1:] - 1`` over the ``R`` row slots (the rows'
``query_start_loc`` repeats ``N_p`` past them; never sampled: sampling runs on the restored
global batch); ``max_query_len`` and ``max_seq_len`` are device maxima over the zero-padded
rows. Under PCP + DCP the indexer's all-gathered shards are put back in global order by
``index_select`` at ``deinterleave_idx`` (a fixed ``W`` entries).
"""

from __future__ import annotations

import torch

from staticattn.builders.pcp.rank_fields import RankFields
from staticattn.builders.pcp.rank_rows import RowViews

__all__ = ["deinterleave", "rank_bounds"]


def rank_bounds(rows: RowViews, fields: RankFields, rank: int, logits_indices: torch.Tensor,
                maxima: torch.Tensor) -> None:
    """Write rank ``rank``'s ``logits_indices`` (int32 ``(R,)``) and ``maxima`` (int32
    ``(2,)``: ``[max_query_len, max_seq_len]``, ``max_seq_len`` over ``seq_lens_upper``)."""
    qsl = rows.query_start_loc[rank]
    logits_indices.copy_(qsl[1:] - 1)
    maxima.copy_(torch.stack([rows.row_len[rank].max(), fields.seq_lens_upper.max()]))


def deinterleave(gathered: torch.Tensor, deinterleave_idx: torch.Tensor,
                 out: torch.Tensor) -> torch.Tensor:
    """``out = gathered[deinterleave_idx]`` along rows: ``gathered`` ``(D * L_pad, ...)`` the
    rank-major all-gather, ``deinterleave_idx`` int ``(W,)``, ``out`` ``(W, ...)``."""
    return torch.index_select(gathered, 0, deinterleave_idx.long(), out=out)
