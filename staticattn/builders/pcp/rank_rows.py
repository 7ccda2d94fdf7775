"""The prefill-context-parallel split on the device, for every rank at once
(``prefill-context-parallel.md`` §2, §8): graph-safe, fixed capacities.

Every rank holds the same staged global batch, so each builds every rank's rows (a leading
``P`` axis) and needs no collective to know the gathered layout. Where vLLM loops, sorts and
copies host arrays, this uses prefix sums over a fixed order:

* a request ``i`` gives rank ``p`` ``n[p, i]`` rows (0, 1 or 2: its chunks ``p`` and
  ``2P-1-p`` when split, its whole query when not);
* the §2.2 order (non-prefilling requests first, then prefills, each in batch order) is the
  ``2S`` virtual slots ``[decode counts, prefill counts]``; their running sum ``cum``
  places request ``i``'s first row, and ``searchsorted(cum, r, right=True)`` finds the
  request of row ``r`` -- no sort, no host read, no data-dependent shape;
* a token's row is found the same way in the rows' ``query_start_loc``.

What depends on data is a count on the device (rows, decode rows, tokens per rank); every
output has a capacity shape and is padded (0, ``False``) past the count. The ops allocate
only temporaries (from the graph's pool under capture) and write the results into the
views with ``copy_``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from staticattn.arena.pcp_config import PCPConfig
from staticattn.builders.pcp.segments import segment_of
from staticattn.kernels.pcp.split_rows import split_rows_triton

__all__ = ["RowViews", "build_rows"]


@dataclass(slots=True)
class RowViews:
    """Every rank's rows and the gathered layout, capacity-shaped (P ranks, R =
    ``2 * max_num_seqs`` rows, N the padded tokens per rank, T the global token capacity).

    row_req, row_offset, row_len : int32 ``(P, R)`` batch index, query offset and length of
        each row (0 past the rows; a rank with no rows has the placeholder, row 0 of 0 tokens
        of request 0). row_replicated : bool ``(P, R)``.
    query_start_loc : int32 ``(P, R + 1)``, repeating ``N_p`` past the rows.
    num_rows, num_decode_rows, num_tokens : int32 ``(P,)`` rows (the placeholder counted),
        non-prefilling rows (they come first), ``N_p``.
    token_to_global, token_req, positions : int32 ``(P, N)`` each local token's global token
        index (``padded_gather_idx`` once flattened), batch index and position; 0 past ``N_p``.
    write_mask : bool ``(P, N)``, whether the copy is canonical.
    hidden_restore_idx : int32 ``(T,)`` the gathered index of each global token's canonical
        copy, 0 past the step's tokens.
    req_first_row : int32 ``(P, S)`` each request's first row on each rank (``S`` =
        ``max_num_seqs``; where the rank has none of it, where its rows would start).
    req_owner : int32 ``(S,)`` the rank that computes a replicated request's tokens (-1 for
        a split request and past the requests).
    """

    row_req: torch.Tensor
    row_offset: torch.Tensor
    row_len: torch.Tensor
    row_replicated: torch.Tensor
    query_start_loc: torch.Tensor
    num_rows: torch.Tensor
    num_decode_rows: torch.Tensor
    num_tokens: torch.Tensor
    token_to_global: torch.Tensor
    token_req: torch.Tensor
    positions: torch.Tensor
    write_mask: torch.Tensor
    hidden_restore_idx: torch.Tensor
    req_first_row: torch.Tensor
    req_owner: torch.Tensor

    @classmethod
    def allocate(cls, cfg: PCPConfig, num_tokens_padded: int, max_num_tokens: int,
                 device: torch.device | str = "cpu") -> RowViews:
        """Views of capacity shape for ``N = num_tokens_padded`` tokens a rank and
        ``T = max_num_tokens`` global tokens (the arena's place to hold them)."""
        P, R, N, S = cfg.pcp_size, cfg.max_rows, num_tokens_padded, cfg.max_num_seqs
        shapes = {"query_start_loc": (P, R + 1), "num_rows": (P,), "num_decode_rows": (P,),
                  "num_tokens": (P,), "hidden_restore_idx": (max_num_tokens,),
                  "req_first_row": (P, S), "req_owner": (S,)}
        views = {}
        for f in fields(cls):
            shape = shapes.get(f.name, (P, N) if f.name in (
                "token_to_global", "token_req", "positions", "write_mask") else (P, R))
            dtype = torch.bool if f.name in ("row_replicated", "write_mask") else torch.int32
            views[f.name] = torch.zeros(shape, dtype=dtype, device=device)
        return cls(**views)


def _gather(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``values[..., index]`` along the last axis, ``values`` broadcast over ``index``'s
    leading axes."""
    return torch.gather(values.expand(*index.shape[:-1], values.shape[-1]), -1, index)


def build_rows(cfg: PCPConfig, query_start_loc: torch.Tensor, is_prefilling: torch.Tensor,
               num_computed: torch.Tensor, out: RowViews, backend: str = "torch") -> RowViews:
    """Write every rank's rows and the gathered layout of a staged global batch into ``out``:
    the torch ops below, or (``backend`` "triton") the same values in three kernels,
    :mod:`staticattn.kernels.pcp.split_rows`.

    Parameters
    ----------
    query_start_loc : int32 ``(S + 1,)``
        The global batch's query starts; padded requests repeat the last (q = 0).
    is_prefilling : bool ``(S,)``
        Whether each request is still prefilling.
    num_computed : int32 ``(S,)``
        Computed tokens C_i of each request.
    out : RowViews
        Capacity-shaped views; ``N`` must hold ``max_p N_p`` (the host picks the bucket).

    backend : {"torch", "triton"}
        A resolved kernel backend (:func:`~staticattn.kernels.runtime.backend.
        resolve_backend`).

    Returns
    -------
    RowViews
        ``out``, written.
    """
    if backend == "triton":
        split_rows_triton(query_start_loc, is_prefilling, num_computed, out,
                          pcp_size=cfg.pcp_size, dcp_size=cfg.dcp_size)
        return out
    P, K, D = cfg.pcp_size, cfg.num_chunks, cfg.dcp_size
    R, N = out.row_req.shape[1], out.token_to_global.shape[1]
    dev = query_start_loc.device
    qsl = query_start_loc.long()
    S = qsl.numel() - 1
    q, pre = qsl[1:] - qsl[:-1], is_prefilling.bool()
    c = (q + K - 1) // K
    replicated = (~pre | ((K - 1) * c >= q)) if D > 1 else ~pre
    replicated = replicated & (q > 0)
    ordinal = torch.cumsum(replicated.long(), 0) - replicated.long()
    ranks = torch.arange(P, device=dev)[:, None]
    split_rows = ((q - ranks * c) > 0).long() + ((q - (K - 1 - ranks) * c) > 0).long()
    # Under D = 1 a replicated request has one owner; under DCP every rank holds it.
    whole = replicated & (ordinal % P == ranks) if D == 1 else replicated.expand(P, S)
    counts_per_req = torch.where(replicated, whole.long(), split_rows)          # (P, S)
    counts = torch.cat([counts_per_req * ~pre, counts_per_req * pre], 1)          # (P, 2S)
    cum = torch.cumsum(counts, 1)
    total = cum[:, -1]
    # Row r of rank p: its virtual slot, request and rank (0 or 1) within the request.
    r = torch.arange(R, device=dev).expand(P, R).contiguous()
    slot = torch.searchsorted(cum, r, right=True).clamp(max=2 * S - 1)
    valid = r < total[:, None]
    req = torch.where(valid, slot % S, 0)
    second = r - (_gather(cum, slot) - _gather(counts, slot))
    rep = _gather(replicated.expand(P, S), req) & valid
    chunk = torch.where(second == 0, ranks, K - 1 - ranks)
    c_row, q_row = _gather(c, req), _gather(q, req)
    offset = torch.where(rep | ~valid, 0, chunk * c_row)
    length = torch.where(rep, q_row, torch.minimum(c_row, q_row - offset).clamp(min=0))
    length = torch.where(valid, length, 0)
    row_qsl = torch.cat([torch.zeros_like(total)[:, None], torch.cumsum(length, 1)], 1)
    n_p = row_qsl[:, -1]
    # Local token j of rank p: its row and place in the row.
    j = torch.arange(N, device=dev).expand(P, N).contiguous()
    row = segment_of(row_qsl, j)
    real = j < n_p[:, None]
    t_req = _gather(req, row)
    within = j - _gather(row_qsl, row) + _gather(offset, row)
    token = torch.where(real, _gather(qsl[:-1], t_req) + within, 0)
    position = torch.where(real, _gather(num_computed.long(), t_req) + within, 0)
    canonical = ~(_gather(rep, row) & (ranks != 0)) if D > 1 else torch.ones_like(real)
    for view, value in ((out.row_req, req), (out.row_offset, offset), (out.row_len, length),
                        (out.row_replicated, rep), (out.query_start_loc, row_qsl),
                        (out.num_rows, total.clamp(min=1)), (out.num_decode_rows, cum[:, S - 1]),
                        (out.num_tokens, n_p), (out.token_to_global, token),
                        (out.token_req, torch.where(real, t_req, 0)), (out.positions, position),
                        (out.write_mask, real & canonical)):
        view.copy_(value)
    first_row = cum - counts
    ids = torch.arange(S, device=dev)
    req_first = torch.where(pre, first_row[:, S + ids], first_row[:, ids])
    owner = (ordinal % P) if D == 1 else torch.zeros_like(ordinal)
    out.req_first_row.zero_()
    out.req_first_row[:, :S].copy_(req_first)
    out.req_owner.fill_(-1)
    out.req_owner[:S].copy_(torch.where(replicated, owner, -1))
    _restore(cfg, qsl, pre, c, replicated, ordinal, first_row, row_qsl, N,
             out.hidden_restore_idx)
    return out


def _restore(cfg: PCPConfig, qsl, pre, c, replicated, ordinal, first_row, row_qsl, N: int,
             out: torch.Tensor) -> None:
    """``hidden_restore_idx`` from the global token's side: token ``g`` at query offset ``o``
    of request ``i`` is computed by the rank of chunk ``o // c`` (``k`` or ``2P-1-k``), or by
    the owner of a replicated request (rank 0 under DCP), in that rank's first row of ``i``
    (the second for a chunk past ``P``)."""
    P, K, S = cfg.pcp_size, cfg.num_chunks, qsl.numel() - 1
    g = torch.arange(out.numel(), device=qsl.device)
    i = segment_of(qsl, g)
    o = g - qsl[i]
    chunk = torch.div(o, c[i].clamp(min=1), rounding_mode="floor")
    owner = (ordinal[i] % P) if cfg.dcp_size == 1 else torch.zeros_like(i)
    rank = torch.where(replicated[i], owner, torch.where(chunk < P, chunk, K - 1 - chunk))
    rank = rank.clamp(0, P - 1)  # past the step's tokens: any rank, masked below
    # A request's first row sits at its virtual slot: i among decodes, S + i among prefills.
    first = first_row[rank, torch.where(pre[i], S + i, i)]
    row = first + (~replicated[i] & (chunk >= P)).long()
    within = torch.where(replicated[i], o, o - chunk * c[i])
    index = rank * N + row_qsl[rank, row.clamp(max=row_qsl.shape[1] - 1)] + within
    out.copy_(torch.where(g < qsl[-1], index, 0))
