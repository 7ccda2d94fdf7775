"""The greedy prefill chunking of :mod:`staticattn.reference.pcp_chunking` on the device
(``prefill-context-parallel.md`` §3.5, §3.6, §8): graph-safe, a fixed maximum of ``C``
chunks, the count on the device.

vLLM walks the items in a host ``while`` loop. Here the walk becomes a jump table: for every
item ``s``, ``next[s]`` is where the greedy chunk starting at ``s`` ends -- the items
``e >= s`` a chunk may still take form a prefix (extents and charges are non-negative, so
both sums only grow), so ``next[s] = s + (number of e that fit)``, at least ``s + 1``. The
chunks start at ``0, next[0], next[next[0]], ...``: ``log2(R)`` doublings of the table give
every start at once. Each chunk's query cut is a count of slices; their running sum places
slice ``c`` (``searchsorted``). Chunks past the count read ``[count, count)`` with an empty
query slice, so a consumer issuing every one of the ``C`` chunks keeps its collectives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from staticattn.arena.pcp_config import PCPConfig
from staticattn.builders.pcp.kv_plan import prefill_rows
from staticattn.builders.pcp.rank_fields import RankFields
from staticattn.builders.pcp.rank_rows import RowViews

__all__ = ["ChunkPlan", "build_flashmla_chunks", "build_indexer_chunks", "greedy_chunks"]


@dataclass(slots=True)
class ChunkPlan:
    """At most ``C`` chunks (``R`` items), each int32 ``(C,)``: ``item_start``,
    ``item_end`` (rows of the rank's prefill rows, or FlashMLA entries), ``query_start``,
    ``query_end`` (charged query tokens from the chunk's first), ``extent`` (the chunk's KV
    entries, ``chunk_tot_seqlen`` for FlashMLA); ``num_chunks`` int32 ``(1,)`` the chunks the
    greedy made, uncapped (above ``C`` the plan was cut short).
    ``workspace_starts`` int32 ``(R,)``: each item's first entry in its chunk's workspace."""

    item_start: torch.Tensor
    item_end: torch.Tensor
    query_start: torch.Tensor
    query_end: torch.Tensor
    extent: torch.Tensor
    num_chunks: torch.Tensor
    workspace_starts: torch.Tensor

    @classmethod
    def allocate(cls, max_chunks: int, max_items: int,
                 device: torch.device | str = "cpu") -> ChunkPlan:
        z = lambda n: torch.zeros(n, dtype=torch.int32, device=device)
        return cls(*(z(max_chunks) for _ in range(5)), z(1), z(max_items))


def _inclusive0(values: torch.Tensor) -> torch.Tensor:
    """``[0, cumsum(values)]``, one longer."""
    return torch.cat([values.new_zeros(1), torch.cumsum(values, 0)])


def greedy_chunks(extent: torch.Tensor, charge: torch.Tensor, count: torch.Tensor,
                  workspace: int, max_logits_elems: int | None, out: ChunkPlan) -> ChunkPlan:
    """Write the greedy chunks of the first ``count`` items into ``out``.

    extent, charge : int64 ``(R,)`` each item's KV entries and charged query tokens (any
        value past ``count``). count : int64 scalar tensor. max_logits_elems : None for no
        logits limit (one query slice a chunk, even when charged 0 tokens).
    """
    R, C = extent.numel(), out.item_start.numel()
    dev = extent.device
    i = torch.arange(R, device=dev)
    real = i < count
    cum_n = _inclusive0(torch.where(real, extent, 0))
    cum_m = _inclusive0(torch.where(real, charge, 0))
    s, e = i[:, None], i[None, :]
    n_se, m_se = cum_n[e + 1] - cum_n[s], cum_m[e + 1] - cum_m[s]
    fits = (e >= s) & (e < count) & (n_se <= workspace)
    if max_logits_elems is not None:
        fits &= m_se * n_se <= max_logits_elems
    # An item that fits nowhere is taken alone; past the count the table stays put.
    nxt = torch.where(real, torch.maximum(i + fits.sum(1), i + 1), i)
    jump = nxt = torch.cat([nxt, nxt.new_full((1,), R)])               # (R + 1,), R -> R
    g = torch.arange(R, device=dev)
    start = torch.zeros_like(g)
    for bit in range(max(1, (R - 1).bit_length())):
        start = torch.where((g >> bit) & 1 == 1, jump[start], start)
        jump = jump[jump]
    live = start < count
    end = torch.where(live, nxt[start], count)
    m, n = cum_m[end] - cum_m[start], cum_n[end] - cum_n[start]
    if max_logits_elems is None:
        step, slices = m.clamp(min=1), live.long()
    else:
        step = torch.where(n > 0, torch.div(max_logits_elems, n.clamp(min=1),
                                            rounding_mode="floor"), m).clamp(min=1)
        slices = torch.where(live, (m + step - 1) // step, 0)
    cum_slices = torch.cumsum(slices, 0)
    c = torch.arange(C, device=dev)
    chunk = torch.searchsorted(cum_slices, c, right=True).clamp(max=R - 1)
    valid = c < cum_slices[-1]
    q0 = (c - (cum_slices[chunk] - slices[chunk])) * step[chunk]
    q1 = torch.minimum(q0 + step[chunk], m[chunk])
    # Each item's first workspace entry: its extent prefix from its chunk's first item.
    own = torch.searchsorted(start.contiguous(), i, right=True).clamp(min=1) - 1
    ws = torch.where(real, cum_n[i] - cum_n[start[own]], 0)
    for view, value in ((out.item_start, torch.where(valid, start[chunk], count)),
                        (out.item_end, torch.where(valid, end[chunk], count)),
                        (out.query_start, torch.where(valid, q0, 0)),
                        (out.query_end, torch.where(valid, q1, 0)),
                        (out.extent, torch.where(valid, n[chunk], 0)),
                        (out.num_chunks, cum_slices[-1:]), (out.workspace_starts, ws)):
        view.copy_(value)
    return out


def _requests(rows: RowViews, fields: RankFields, rank: int):
    """Rank ``rank``'s prefill requests as items: ``(first row, count, S_k, charge)``, the
    first three int64 ``(R,)`` by request, the count a scalar; charge = rows * longest."""
    _, src, live, first = prefill_rows(rows, fields, rank)
    R = src.numel()
    entry = (torch.cumsum(first.long(), 0) - 1).clamp(min=0)
    length = torch.where(live, rows.row_len[rank].long()[src], 0)
    n_rows = torch.zeros(R, dtype=torch.int64, device=src.device).scatter_add_(
        0, entry, live.long())
    longest = torch.zeros_like(n_rows).scatter_reduce_(0, entry, length, "amax")
    k = torch.arange(R, device=src.device)
    first_row = torch.searchsorted(entry.contiguous(), k).clamp(max=R - 1)
    shard = fields.dcp_local_seq_lens_upper.long()[src][first_row]
    return first_row, first.long().sum(), shard, n_rows * longest, live.long().sum()


def build_indexer_chunks(cfg: PCPConfig, rows: RowViews, fields: RankFields, rank: int,
                         workspace: int, max_logits_elems: int, out: ChunkPlan,
                         ratio: int = 1) -> ChunkPlan:
    """Rank ``rank``'s indexer prefill chunks (§3.5) into ``out``, items in prefill rows
    (rows and fields of the same batch): under D = 1 the rows (extent ``seq_len // ratio``,
    charge the row length), under D > 1 the requests (extent ``D S_k``, charge rows times
    the longest row), widened back to rows."""
    if cfg.dcp_size == 1:
        _, src, live, _ = prefill_rows(rows, fields, rank)
        extent = torch.div(fields.seq_lens_upper.long()[src], ratio, rounding_mode="floor")
        return greedy_chunks(extent, rows.row_len[rank].long()[src], live.long().sum(),
                             workspace, max_logits_elems, out)
    first_row, count, shard, charge, n_pre = _requests(rows, fields, rank)
    greedy_chunks(cfg.dcp_size * shard, charge, count, workspace, max_logits_elems, out)
    bounds = torch.cat([first_row, n_pre[None]])
    widened = torch.where(torch.arange(bounds.numel(), device=bounds.device) < count,
                          bounds, n_pre)
    out.item_start.copy_(widened[out.item_start.long()])
    out.item_end.copy_(widened[out.item_end.long()])
    return out


def build_flashmla_chunks(rows: RowViews, fields: RankFields, rank: int, workspace: int,
                          out: ChunkPlan) -> ChunkPlan:
    """Rank ``rank``'s FlashMLA-sparse prefill chunks (§3.6) into ``out``: items are the
    entries (requests of the prefill rows), extent ``S_k``, no logits limit; ``extent`` is
    each chunk's ``chunk_tot_seqlen`` and ``workspace_starts`` each entry's start in its
    chunk. Every ``S_k`` must fit ``workspace`` (checked on the host beforehand)."""
    _, count, shard, _, _ = _requests(rows, fields, rank)
    return greedy_chunks(shard, torch.zeros_like(shard), count, workspace, None, out)
