"""One rank's per-row metadata and the gathered slot mappings, on the device
(``prefill-context-parallel.md`` §3.1, §3.2, §4.2), from :class:`RowViews`; graph-safe,
capacity-shaped, 0 (slots: -1) past the rank's rows or tokens.

A row of request ``i`` at query offset ``o`` of length ``n`` starts at position
``s = C_i + o``; its ``seq_lens`` is ``s + n`` (0 for the placeholder row), its host bound
``s + n``, and under DCP its local length is this DCP rank's share of ``[0, s + n)`` while
the bound is DCP rank 0's share of the whole request ``[0, C_i + q_i)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from staticattn.arena.pcp_config import PCPConfig
from staticattn.builders.pcp.rank_rows import RowViews
from staticattn.kernels.dcp.ownership import dcp_local_count, dcp_local_index, dcp_owner

__all__ = ["RankFields", "build_rank_fields", "compressed_gathered_slots", "gathered_slots"]

PAD = -1


@dataclass(slots=True)
class RankFields:
    """One rank's per-row metadata, each int32 ``(R,)`` (``is_prefilling`` bool ``(R,)``):
    ``start_pos`` (= ``num_computed_tokens``), ``seq_lens``, ``seq_lens_upper``,
    ``req_idx`` (request-state index), ``is_prefilling``, ``global_query_lens``,
    ``global_seq_lens_upper``, ``dcp_local_seq_lens``, ``dcp_local_seq_lens_upper``."""

    start_pos: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_upper: torch.Tensor
    req_idx: torch.Tensor
    is_prefilling: torch.Tensor
    global_query_lens: torch.Tensor
    global_seq_lens_upper: torch.Tensor
    dcp_local_seq_lens: torch.Tensor
    dcp_local_seq_lens_upper: torch.Tensor


def build_rank_fields(cfg: PCPConfig, rows: RowViews, rank: int, dcp_rank: int,
                      query_start_loc: torch.Tensor, is_prefilling: torch.Tensor,
                      num_computed: torch.Tensor, req_state_idx: torch.Tensor,
                      out: RankFields) -> RankFields:
    """Write rank ``rank``'s row metadata into ``out``.

    Parameters
    ----------
    rows : RowViews
        Written by :func:`~staticattn.builders.pcp.rank_rows.build_rows` from the same batch.
    query_start_loc : int32 ``(S + 1,)``; is_prefilling : bool ``(S,)``;
    num_computed, req_state_idx : int32 ``(S,)``
        The staged global batch.
    """
    D, interleave = cfg.dcp_size, cfg.cp_kv_cache_interleave_size
    req, offset, length = (rows.row_req[rank].long(), rows.row_offset[rank].long(),
                           rows.row_len[rank].long())
    held = torch.arange(req.numel(), device=req.device) < rows.num_rows[rank]
    q = (query_start_loc[1:] - query_start_loc[:-1]).long()[req]
    computed = num_computed.long()[req]
    start = computed + offset
    seq_len = torch.where(length > 0, start + length, 0)
    total = computed + q
    for view, value in (
            (out.start_pos, start), (out.seq_lens, seq_len), (out.seq_lens_upper, start + length),
            (out.req_idx, req_state_idx.long()[req]), (out.is_prefilling, is_prefilling[req]),
            (out.global_query_lens, q), (out.global_seq_lens_upper, total),
            (out.dcp_local_seq_lens, dcp_local_count(seq_len, D, dcp_rank, interleave)),
            (out.dcp_local_seq_lens_upper, dcp_local_count(total, D, 0, interleave))):
        view.copy_(torch.where(held, value, 0))
    return out


def gathered_slots(cfg: PCPConfig, rows: RowViews, block_table: torch.Tensor, dcp_rank: int,
                   out: torch.Tensor) -> torch.Tensor:
    """The gathered slot mapping as DCP rank ``dcp_rank`` writes it (§3.2): the token's slot
    at its canonical copy when this DCP rank holds it, PAD (-1) elsewhere.

    block_table : int32 ``(S, W)`` each request's block row. out : int64 ``(P * N,)``.
    """
    bs, D, interleave = cfg.block_size, cfg.dcp_size, cfg.cp_kv_cache_interleave_size
    pos, req = rows.positions.long().flatten(), rows.token_req.long().flatten()
    column = torch.div(pos, bs * D, rounding_mode="floor").clamp(max=block_table.shape[1] - 1)
    block = block_table.long()[req, column]
    inner = pos % (bs * D)
    mine = rows.write_mask.flatten()
    if D > 1:
        mine = mine & (dcp_owner(inner, D, interleave) == dcp_rank)
        inner = dcp_local_index(inner, D, interleave)
    return out.copy_(torch.where(mine, block * bs + inner, PAD))


def compressed_gathered_slots(rows: RowViews, block_table: torch.Tensor, block_size: int,
                              ratio: int, out: torch.Tensor) -> torch.Tensor:
    """V4.1's compressed slot of each gathered token (D = 1): the token at ``pos`` with
    ``(pos + 1) % ratio == 0`` writes state ``pos // ratio``; others and padding PAD.

    block_table : int32 ``(S, W)`` the compressed group's rows, ``block_size`` states a
    block. out : int64 ``(P * N,)``.
    """
    pos, req = rows.positions.long().flatten(), rows.token_req.long().flatten()
    state = torch.div(pos, ratio, rounding_mode="floor")
    column = torch.div(state, block_size, rounding_mode="floor").clamp(
        max=block_table.shape[1] - 1)
    slot = block_table.long()[req, column] * block_size + state % block_size
    return out.copy_(torch.where(rows.write_mask.flatten() & ((pos + 1) % ratio == 0), slot,
                                 PAD))
