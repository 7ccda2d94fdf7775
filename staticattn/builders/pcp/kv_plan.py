"""One rank's prefill-row KV extents on the device (``prefill-context-parallel.md`` §3.4-§3.6,
§8): graph-safe, capacity-shaped, the rank's prefill rows as one chunk.

The prefill rows are ``[nd, num_rows)`` (decode rows come first); prefill row ``r`` is row
``nd + r``. Each row owns an extent of the chunk's KV buffer:

* PCP only: every row its own sequence of ``seq_len // ratio`` entries;
* PCP + DCP: a request's first row owns its region of ``D * S_k`` entries, its other row none.

``cu_seq_lens`` is the running sum of the extents (repeating the total past the rows),
``row_start_cu[r]`` the start of the region row ``r`` reads, and a query token at ``pos`` reads
``[ks, ke) = [row_start_cu[r], row_start_cu[r] + (pos + 1) // ratio)``. Under PCP + DCP the
entry ``t`` of a region comes from the rank-major DCP all-gather at ``deinterleave_idx``;
past the total every index is 0 (a valid row, beyond every ``ke``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from staticattn.arena.pcp_config import PCPConfig
from staticattn.builders.pcp.rank_fields import RankFields
from staticattn.builders.pcp.rank_rows import RowViews
from staticattn.builders.pcp.segments import segment_of
from staticattn.kernels.dcp.ownership import dcp_local_index, dcp_owner
from staticattn.kernels.pcp.prefill_extents import prefill_extents_triton

__all__ = ["PrefillExtents", "build_prefill_extents", "prefill_rows"]


@dataclass(slots=True)
class PrefillExtents:
    """A rank's prefill-chunk extents (R rows, N tokens, ``W`` the workspace capacity).

    cu_seq_lens, local_cu_seq_lens, row_start_cu : int32 ``(R + 1,)`` (local: the DCP shard
        sums; PCP only, equal to ``cu_seq_lens``).
    ks, ke : int32 ``(N,)`` per prefill token (token ``u`` is the rank's local token
        ``nd_tokens + u``), 0 past them.
    deinterleave_idx, token_to_seq : int32 ``(W,)`` (PCP + DCP), 0 past the total.
    request_ids : int32 ``(N,)`` each local token's FlashMLA entry (its request among the
        prefill rows), -1 for decode tokens and padding.
    workspace_starts : int32 ``(R,)`` each entry's first workspace row (the running sum of
        the entries' shards ``S_k``), 0 past the entries.
    totals : int32 ``(2,)`` ``[total, padded_local_total]``.
    row_entry : int32 ``(R,)`` each prefill row's entry (-1 before the first; past the rows,
        the last).
    """

    cu_seq_lens: torch.Tensor
    local_cu_seq_lens: torch.Tensor
    row_start_cu: torch.Tensor
    ks: torch.Tensor
    ke: torch.Tensor
    deinterleave_idx: torch.Tensor
    token_to_seq: torch.Tensor
    request_ids: torch.Tensor
    workspace_starts: torch.Tensor
    totals: torch.Tensor
    row_entry: torch.Tensor

    @classmethod
    def allocate(cls, cfg: PCPConfig, num_tokens_padded: int, workspace: int,
                 device: torch.device | str = "cpu") -> PrefillExtents:
        """Views for ``N = num_tokens_padded`` tokens and a ``workspace`` of entries."""
        R, N = cfg.max_rows, num_tokens_padded
        z = lambda *shape: torch.zeros(shape, dtype=torch.int32, device=device)
        return cls(z(R + 1), z(R + 1), z(R + 1), z(N), z(N), z(workspace), z(workspace), z(N),
                   z(R), z(2), z(R))

    def shard_rows(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Where row ``w`` (int64 ``(n,)``) of this rank's shard of the plan comes from:
        ``(region, key, live)`` -- its region (int64: the prefill row ``region``, rank row
        ``nd + region``, whose block-table row holds the request's keys), its local key in
        that request's shard (int64), and whether it lies below the padded local total
        (bool; past it the row is no key)."""
        local_cu = self.local_cu_seq_lens.long()
        region = segment_of(local_cu, w)
        return region, w - local_cu[region], w < self.totals[1].long()

    def shard_pages(self, w: torch.Tensor, block_table: torch.Tensor, nd_rows: torch.Tensor,
                    page: int, block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Where row ``w`` (int64 ``(n,)``) of this rank's shard lives in its cache:
        ``(block, offset)``, int64 ``(n,)`` each -- its local key (:meth:`shard_rows`) through
        the block-table row ``nd_rows + region`` (``block_table`` int32 ``(rows, width)``,
        pages of ``page`` entries; ``nd_rows`` the decode rows in front, an int64 scalar
        tensor). A row past the padded local total reads entry 0 of block 0 (never
        attended). ``block`` (int64 ``(n,)``) receives the blocks and is returned."""
        region, key, live = self.shard_rows(w)
        row = (nd_rows + region).clamp_(0, block_table.shape[0] - 1)
        key.mul_(live)
        column = torch.div(key, page, rounding_mode="floor").clamp_(max=block_table.shape[1] - 1)
        block.copy_(block_table[row, column]).mul_(live)
        return block, torch.remainder(key, page, out=key)

    def gathered_rows(self, slab: int) -> torch.Tensor:
        """int64 ``(W,)``: where global entry ``i`` lies in the rank-major all-gather of every
        rank's shard rows, each rank's in a slab of ``slab`` rows -- ``deinterleave_idx``
        strides the ranks by the padded local total ``S``, the buffer by ``slab``:
        ``owner * slab + idx - owner * S`` with ``owner = idx // S``."""
        idx = self.deinterleave_idx.long()
        stride = self.totals[1].long().clamp(min=1)
        owner = torch.div(idx, stride, rounding_mode="floor")
        return owner * (slab - stride) + idx


def prefill_rows(rows: RowViews, fields: RankFields, rank: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s prefill rows, indexed from the first (``R`` capacity):
    ``(nd, src, live, request_first)`` -- the decode rows in front (int64 scalar), each
    prefill row's rank row ``nd + r`` (int64 ``(R,)``, clamped), whether it is a row (bool
    ``(R,)``; none when the rank holds no token) and whether it starts its request's run."""
    R = rows.row_req.shape[1]
    nd = rows.num_decode_rows[rank].long()
    n_pre = (rows.num_rows[rank].long() - nd) * (rows.num_tokens[rank] > 0)
    r = torch.arange(R, device=rows.row_req.device)
    src = (nd + r).clamp(max=R - 1)
    live = r < n_pre
    req = fields.req_idx.long()[src]
    return nd, src, live, live & ((r == 0) | (req != torch.roll(req, 1)))


def _exclusive(values: torch.Tensor) -> torch.Tensor:
    """``[0, cumsum(values)]``, one longer."""
    return torch.cat([values.new_zeros(1), torch.cumsum(values, 0)])


def build_prefill_extents(cfg: PCPConfig, rows: RowViews, fields: RankFields, rank: int,
                          out: PrefillExtents, ratio: int = 1,
                          backend: str = "torch") -> PrefillExtents:
    """Write rank ``rank``'s prefill extents into ``out`` (rows and fields of the same
    batch). Under D = 1 the PCP-only rows, else the PCP + DCP global plan. ``backend``
    "triton": the same values in three kernels (:mod:`staticattn.kernels.pcp.
    prefill_extents`)."""
    D, interleave = cfg.dcp_size, cfg.cp_kv_cache_interleave_size
    if backend == "triton":
        prefill_extents_triton(rows, fields, out, rank, dcp_size=D, interleave=interleave,
                               ratio=ratio)
        return out
    R = rows.row_req.shape[1]
    dev = rows.row_req.device
    nd, src, live, request_first = prefill_rows(rows, fields, rank)
    r = torch.arange(R, device=dev)
    shard = torch.where(request_first, fields.dcp_local_seq_lens_upper.long()[src], 0)
    first = live if D == 1 else request_first
    extent = torch.where(live, fields.seq_lens.long()[src] // ratio, 0) if D == 1 else shard
    global_cu, local_cu = _exclusive(extent * D), _exclusive(extent)
    region = torch.cummax(torch.where(first, r, 0), 0).values
    row_start = torch.where(live, global_cu[region], global_cu[-1])
    row_start = torch.cat([row_start, global_cu[-1:]])
    total, local_total = global_cu[-1], local_cu[-1]
    # Query tokens of the prefill rows: local token j = first prefill token + u.
    qsl = rows.query_start_loc[rank].long()
    # qsl[nd] as a one-element tensor: indexing by a 0-dim tensor would read it to the host.
    first_prefill = qsl.index_select(0, nd.view(1))
    u = torch.arange(out.ks.numel(), device=dev)
    j = first_prefill + u
    token_row = segment_of(qsl, j)
    real = j < qsl[-1]
    pos = fields.start_pos.long()[token_row] + j - qsl[token_row]
    ks = torch.where(real, row_start[(token_row - nd).clamp(0, R - 1)], 0)
    ke = torch.where(real, ks + torch.div(pos + 1, ratio, rounding_mode="floor"), 0)
    # FlashMLA entries: one per region, numbered by a running count of first rows.
    entry = torch.cumsum(request_first.long(), 0) - 1
    local_token = torch.arange(out.request_ids.numel(), device=dev)
    own_row = segment_of(qsl, local_token)
    request_ids = torch.where((local_token >= first_prefill) & (local_token < qsl[-1]),
                              entry[(own_row - nd).clamp(0, R - 1)], -1)
    entry_first = torch.searchsorted(entry.contiguous(), r)  # the first row of entry r
    starts = torch.where(r <= entry[-1], _exclusive(shard)[entry_first.clamp(max=R - 1)], 0)
    for view, value in ((out.cu_seq_lens, global_cu), (out.local_cu_seq_lens, local_cu),
                        (out.row_start_cu, row_start), (out.ks, ks), (out.ke, ke),
                        (out.request_ids, request_ids), (out.workspace_starts, starts),
                        (out.totals, torch.stack([total, local_total])),
                        (out.row_entry, entry)):
        view.copy_(value)
    _deinterleave(global_cu, local_cu, extent, total, local_total, D, interleave, out)
    return out


def _deinterleave(global_cu, local_cu, extent, total, local_total, world: int,
                  interleave: int, out: PrefillExtents) -> None:
    """Entry ``t`` of a region (region found by ``searchsorted`` over ``cu_seq_lens``):
    owner ``(t // I) % D`` holds it at local index ``(t // (I D)) I + t % I``, clamped into
    the request's shard (the tail past the request's length is never read)."""
    t_abs = torch.arange(out.deinterleave_idx.numel(), device=global_cu.device)
    region = segment_of(global_cu, t_abs)
    t = t_abs - global_cu[region]
    local = torch.minimum(dcp_local_index(t, world, interleave), extent[region] - 1)
    index = dcp_owner(t, world, interleave) * local_total + local_cu[region] + local
    inside = t_abs < total
    out.deinterleave_idx.copy_(torch.where(inside, index, 0))
    out.token_to_seq.copy_(torch.where(inside, region, 0))
