"""The indexer's prefill chunks planned on the device (spec §4.6-§4.7), for steps whose
composition the host does not know when the graph runs.

The plan is the reference's greedy one, over the prefill requests ``[D, k)`` (``D``, ``k`` from
the staging's ``step_counts``), with ``N_r = L_r // R`` compressed keys and ``M_r`` queries:
a request range grows while ``sum N <= workspace`` and ``(sum M) * (sum N) <= E``
(``E = max_logits_bytes // 4``); a request that does not fit even alone is taken alone; each
range is cut into query sub-chunks of ``max(1, E // sum N)`` queries; ranges without a key
are dropped. Outputs, all over static extents:

* ``chunk_bounds`` int32 ``(C, 8)``: row ``c < num_chunks`` is ``[req_start, req_end,
  token_start, token_end, total_seq_lens, skip_kv_gather, 0, 0]``; rows past it are zero;
* ``num_chunks`` int32 ``(1,)``;
* ``cu_seq_lens`` int32 ``(2 R,)``: the range ``[s, e)`` owns ``[2s, s + e + 1)``, its key
  prefix sums ``[0, N_s, N_s + N_{s+1}, ...]``; every other entry 0;
* ``req_key_start`` int32 ``(R,)``: the keys of request ``r``'s range before ``r`` (0 for
  requests that are not prefills);
* ``cu_seqlen_ks`` / ``cu_seqlen_ke`` int32 ``(T,)``, by global token: a prefill token of
  request ``r`` at position ``p`` gets ``ks = req_key_start[r]``,
  ``ke = ks + (p + 1) // R``; every other token ``0, 0``.

Under decode context parallelism (``dcp``) the plan is the same on every rank (it follows the
global key counts) and the rank's local row bounds come with it, as in the eager build:
``chunk_bounds`` columns 6 and 7 hold the chunk's local key count on this rank and the largest
over the ranks (rank 0's: a rank never holds more of a sequence than rank 0); the local key
prefix sums go to ``local_cu_seq_lens`` (laid out as ``cu_seq_lens``), the local keys before
each request to ``local_req_key_start``, and ``cu_seqlen_ks`` / ``ke`` are local. Without
``dcp`` columns 6 and 7 are 0.

Example (R = 4, workspace 100, E = 250): prefills ``N = [10, 10, 10]``, ``M = [5, 5, 5]``
(example C) -> ranges ``[0, 2)``, ``[2, 3)``; chunk rows ``[0, 2, 0, 10, 20, 0]`` and
``[2, 3, 10, 15, 10, 0]``; ``cu_seq_lens[0:3] = [0, 10, 20]``, ``cu_seq_lens[5:7] = [0, 10]``.
"""

from __future__ import annotations

import torch

from staticattn.kernels.dcp.ownership import DCPShard, dcp_local_count, triton_dcp_helpers
from staticattn.kernels.runtime.compiled_launch import launch
from staticattn.kernels.runtime.deferred import lazy_jit, publish
from staticattn.kernels.staging.stage_inputs import (
    COUNT_DECODE_TOKENS,
    COUNT_DECODES,
    COUNT_REQS,
    COUNT_TOKENS,
)
from staticattn.kernels.staging.step_counts import step_counts_jit

__all__ = ["CHUNK_FIELDS", "max_prefill_chunks", "plan_prefill_chunks"]

#: Columns of ``chunk_bounds`` (six used, padded to eight for aligned rows).
CHUNK_FIELDS = 8
_BLOCK = 1024


def max_prefill_chunks(num_reqs: int, num_tokens: int, max_keys_per_req: int,
                       logits_budget: int) -> int:
    """How many chunks a step of ``num_reqs`` requests / ``num_tokens`` tokens can need.

    Every request range is one chunk unless a single request is cut into query sub-chunks;
    that happens only to a request taken alone, which has at most ``max_keys_per_req`` keys,
    so its sub-chunks hold at least ``max(1, E // max_keys_per_req)`` queries each.
    """
    per_sub_chunk = max(1, logits_budget // max(1, max_keys_per_req))
    return num_reqs + -(-num_tokens // per_sub_chunk) + 1


def plan_prefill_chunks(
    backend: str,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    positions: torch.Tensor,
    token_to_req: torch.Tensor,
    step_counts: torch.Tensor,
    chunk_bounds: torch.Tensor,
    num_chunks: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    req_key_start: torch.Tensor,
    cu_seqlen_ks: torch.Tensor,
    cu_seqlen_ke: torch.Tensor,
    *,
    num_reqs: int,
    num_tokens: int,
    compress_ratio: int,
    workspace: int,
    logits_budget: int,
    dcp: DCPShard | None = None,
    local_cu_seq_lens: torch.Tensor | None = None,
    local_req_key_start: torch.Tensor | None = None,
) -> None:
    """Plan the step's prefill chunks on the device (see the module docstring).

    Parameters
    ----------
    query_start_loc : int32 ``(>= num_reqs + 1,)``;  seq_lens : int32 ``(>= num_reqs,)``
    positions : int64 ``(>= num_tokens,)``;  token_to_req : int32 ``(>= num_tokens,)``
    step_counts : int32 ``(4,)``, the staging's ``[k, nt, D, Td]``
    chunk_bounds : int32 ``(C, 8)``, contiguous;  num_chunks : int32 ``(1,)``
    cu_seq_lens : int32 ``(>= 2 num_reqs,)``;  req_key_start : int32 ``(>= num_reqs,)``
    cu_seqlen_ks, cu_seqlen_ke : int32 ``(>= num_tokens,)``
    num_reqs, num_tokens : int
        Static extents (the bucket).
    workspace : int
        Keys one chunk may gather.
    logits_budget : int
        ``E``, fp32 logits one chunk may hold.
    dcp : DCPShard or None
        This rank's shard of the compressed keys (``interleave = I // R``).
    local_cu_seq_lens : int32 ``(>= 2 num_reqs,)``;  local_req_key_start : int32
    ``(>= num_reqs,)``
        Written under ``dcp`` only.

    Graph-safe with either backend. The Triton version is one program: the greedy plan is
    sequential over the prefill requests, which are few in a step.
    """
    sharded = dcp is not None and dcp.world > 1
    args = (query_start_loc, seq_lens, positions, token_to_req, step_counts, chunk_bounds,
            num_chunks, cu_seq_lens, req_key_start, cu_seqlen_ks, cu_seqlen_ke)
    if backend == "triton":
        world, rank, interleave = dcp if sharded else (1, 0, 1)
        launch(_plan_kernel(), (1,),
            *args, local_cu_seq_lens if sharded else cu_seq_lens,
            local_req_key_start if sharded else req_key_start, num_reqs, num_tokens,
            chunk_bounds.shape[0], compress_ratio, workspace, logits_budget, world, rank,
            interleave, DCP=sharded, BLOCK=_BLOCK, FIELDS=CHUNK_FIELDS,
        )
        return
    local = (local_cu_seq_lens, local_req_key_start, dcp) if sharded else None
    _plan_torch(*args, num_reqs, num_tokens, compress_ratio, workspace, logits_budget, local)


def _plan_torch(qsl, seq_lens, positions, token_to_req, counts, chunk_bounds, num_chunks,
                cu_seq_lens, req_key_start, ks_out, ke_out, num_reqs, num_tokens, ratio,
                workspace, budget, local=None) -> None:
    """The same plan with tensor ops only: a static loop over the ``num_reqs`` request slots
    finds the ranges (masked updates of 0-d state), then the chunk rows are laid out at once.
    ``local``: ``(local_cu_seq_lens, local_req_key_start, dcp)`` under DCP, else None."""
    dev = qsl.device
    i64 = torch.int64
    k, d = counts[COUNT_REQS].long(), counts[COUNT_DECODES].long()
    keys_of = seq_lens[:num_reqs].long().clamp(min=0) // ratio
    # Key counts tracked per range: [global, this rank's, rank 0's (the largest)]; the local
    # ones only under DCP.
    if local is None:
        tracked_of = keys_of[None]
    else:
        world, rank, interleave = local[2]
        tracked_of = torch.stack([keys_of, dcp_local_count(keys_of, world, rank, interleave),
                                  dcp_local_count(keys_of, world, 0, interleave)])
    queries_of = (qsl[1 : num_reqs + 1] - qsl[:num_reqs]).long()
    zero = torch.zeros((), dtype=i64, device=dev)
    start, m = d.clone(), zero.clone()
    tracked = torch.zeros(tracked_of.shape[0], dtype=i64, device=dev)
    key_start = torch.zeros(tracked_of.shape[0], num_reqs, dtype=i64, device=dev)
    range_of = torch.zeros(num_reqs, dtype=i64, device=dev)
    # Per range, at the index of its first request: its end, queries and tracked keys.
    ends = torch.zeros(num_reqs + 1, dtype=i64, device=dev)
    queries = torch.zeros(num_reqs + 1, dtype=i64, device=dev)
    range_keys = torch.zeros(tracked_of.shape[0], num_reqs + 1, dtype=i64, device=dev)

    def close(when, end):
        # Index num_reqs is a slot nobody reads; the index stays a device tensor (a 0-d
        # index would be read back to the host).
        at = torch.where(when, start, num_reqs).reshape(1)
        ends.index_put_((at,), end.reshape(1))
        queries.index_put_((at,), m.reshape(1))
        range_keys.index_copy_(1, at, tracked[:, None])

    for e in range(num_reqs):
        live = (e >= d) & (e < k)
        ne, me, keys = tracked_of[:, e], queries_of[e], tracked[0]
        fits = (keys + ne[0] <= workspace) & ((m + me) * (keys + ne[0]) <= budget)
        full = live & ~fits & (e > start)
        close(full, zero + e)
        start = torch.where(full, e, start)
        m, tracked = torch.where(full, 0, m), torch.where(full, 0, tracked)
        fits = torch.where(full, (ne[0] <= workspace) & (me * ne[0] <= budget), fits)
        key_start[:, e] = torch.where(live, tracked, 0)
        range_of[e] = start
        m, tracked = torch.where(live, m + me, m), torch.where(live, tracked + ne, tracked)
        alone = live & ~fits
        close(alone, zero + e + 1)
        start = torch.where(alone, e + 1, start)
        m, tracked = torch.where(alone, 0, m), torch.where(alone, 0, tracked)
    close(start < k, k)
    ends, queries, range_keys = ends[:num_reqs], queries[:num_reqs], range_keys[:, :num_reqs]
    total_keys = range_keys[0]
    # Chunk rows: each range with keys gives ceil(M / step) sub-chunks, in request order.
    step = torch.where(total_keys > 0, (budget // total_keys.clamp(min=1)).clamp(min=1), 1)
    subs = torch.where((ends > 0) & (total_keys > 0), -(-queries // step), 0)
    last_row = torch.cumsum(subs, 0)
    c = torch.arange(chunk_bounds.shape[0], device=dev)
    owner = torch.searchsorted(last_row, c, right=True).clamp(max=max(num_reqs - 1, 0))
    q0 = (c - (last_row - subs)[owner]) * step[owner]
    q1 = torch.minimum(q0 + step[owner], queries[owner])
    first_token = qsl[:num_reqs][owner].long()
    local_totals = ([range_keys[1][owner], range_keys[2][owner]] if local is not None
                    else [torch.zeros_like(c)] * 2)
    rows = torch.stack([owner, ends[owner], first_token + q0, first_token + q1,
                        total_keys[owner], (q0 > 0).long(), *local_totals], 1)
    total = last_row[-1] if num_reqs else zero
    chunk_bounds.copy_(torch.where((c < total)[:, None], rows, 0))
    num_chunks.copy_(total.clamp(max=chunk_bounds.shape[0]).reshape(1))
    # Key prefix sums of each range [s, e) in entries [2s, s + e + 1) of cu_seq_lens (and of
    # local_cu_seq_lens); a scratch slot at the end takes the writes of requests that are
    # not prefills.
    b = torch.arange(num_reqs, device=dev)
    prefill_req = (b >= d) & (b < k)
    closes = prefill_req & (ends > 0)
    outs = [(cu_seq_lens, req_key_start)] + ([local[:2]] if local is not None else [])
    for which, (cu_out, start_out) in enumerate(outs):
        cu = torch.zeros(2 * num_reqs + 1, dtype=i64, device=dev)
        cu[torch.where(prefill_req, range_of + b, 2 * num_reqs)] = key_start[which]
        cu[torch.where(closes, b + ends, 2 * num_reqs)] = range_keys[which]
        cu_out[: 2 * num_reqs].copy_(cu[: 2 * num_reqs])
        start_out[:num_reqs].copy_(key_start[which])
    t = torch.arange(num_tokens, device=dev)
    prefill = (t >= counts[COUNT_DECODE_TOKENS]) & (t < counts[COUNT_TOKENS])
    # The token's row bounds: local under DCP (the last of ``outs`` is the local one).
    ks = key_start[len(outs) - 1][token_to_req[:num_tokens].long()]
    visible = (positions[:num_tokens] + 1).clamp(min=0) // ratio
    if local is not None:
        visible = dcp_local_count(visible, world, rank, interleave)
    ke = ks + visible
    ks_out[:num_tokens].copy_(torch.where(prefill, ks, 0))
    ke_out[:num_tokens].copy_(torch.where(prefill, ke, 0))


@lazy_jit(step_counts_jit, triton_dcp_helpers)
def _plan_kernel(triton, tl, live_count, SLOT_REQS, SLOT_TOKENS, SLOT_DECODES, SLOT_DECODE_TOKENS,
                 dcp_local_count_tl, **_):
    @triton.jit
    def emit(chunk_bounds, cu_seq_lens, local_cu_seq_lens, qsl, start, end, m, keys, lkeys,
             zkeys, chunks, max_chunks, budget, FIELDS: tl.constexpr, DCP: tl.constexpr):
        """Close the range [start, end): its last key prefix sums and its sub-chunk rows
        (``lkeys`` / ``zkeys``: this rank's and rank 0's keys of the range, under DCP)."""
        tl.store(cu_seq_lens + start + end, keys.to(tl.int32))
        if DCP:
            tl.store(local_cu_seq_lens + start + end, lkeys.to(tl.int32))
        if keys > 0:
            step = tl.maximum(budget // keys, 1).to(tl.int32)
            first_token = tl.load(qsl + start)
            field = tl.arange(0, FIELDS)
            for q0 in range(0, m.to(tl.int32), step):
                q1 = tl.minimum(q0 + step, m.to(tl.int32))
                row = tl.where(field == 0, start, tl.where(field == 1, end, 0))
                row = tl.where(field == 2, first_token + q0, row)
                row = tl.where(field == 3, first_token + q1, row)
                row = tl.where(field == 4, keys.to(tl.int32), row)
                row = tl.where(field == 5, (q0 > 0) * 1, row)
                if DCP:
                    row = tl.where(field == 6, lkeys.to(tl.int32), row)
                    row = tl.where(field == 7, zkeys.to(tl.int32), row)
                # (A 0-d mask is broadcast explicitly: Triton's interpreter needs it.)
                tl.store(chunk_bounds + chunks * FIELDS + field, row,
                         mask=chunks + field * 0 < max_chunks)
                chunks += 1
        return chunks

    @triton.jit
    def clear(ptr, start, end, BLOCK: tl.constexpr):
        """Zero the int32 entries ``[start, end)`` of ``ptr``."""
        offs = tl.arange(0, BLOCK)
        for c0 in range(start, end, BLOCK):
            tl.store(ptr + c0 + offs, tl.zeros([BLOCK], tl.int32), mask=c0 + offs < end)

    publish(globals(), emit, clear)

    @triton.jit(do_not_specialize=["num_reqs", "num_tokens", "max_chunks", "compress_ratio",
                                   "workspace", "budget"])
    def plan_kernel(
        qsl, seq_lens, positions, token_to_req, counts, chunk_bounds, num_chunks_out,
        cu_seq_lens, req_key_start, ks_out, ke_out, local_cu_seq_lens, local_req_key_start,
        num_reqs, num_tokens, max_chunks, compress_ratio, workspace, budget, dcp_world,
        dcp_rank, dcp_interleave, DCP: tl.constexpr, BLOCK: tl.constexpr,
        FIELDS: tl.constexpr,
    ):
        # The plan always reads the step's counts on the device, inside graphs and out.
        k = live_count(counts, SLOT_REQS, 0, True)
        nt = live_count(counts, SLOT_TOKENS, 0, True)
        d = live_count(counts, SLOT_DECODES, 0, True)
        td = live_count(counts, SLOT_DECODE_TOKENS, 0, True)
        offs = tl.arange(0, BLOCK)
        # Clear what the sequential pass may leave unwritten, and wait for the clear.
        clear(cu_seq_lens, 0, 2 * num_reqs, BLOCK)
        clear(req_key_start, 0, num_reqs, BLOCK)
        if DCP:
            clear(local_cu_seq_lens, 0, 2 * num_reqs, BLOCK)
            clear(local_req_key_start, 0, num_reqs, BLOCK)
        tl.debug_barrier()
        start = d
        m = tl.zeros([], tl.int64)
        keys = tl.zeros([], tl.int64)
        # Under DCP: this rank's and rank 0's keys of the open range.
        lkeys = tl.zeros([], tl.int64)
        zkeys = tl.zeros([], tl.int64)
        chunks = tl.zeros([], tl.int32)
        for e in range(d, k):
            ne = (tl.maximum(tl.load(seq_lens + e), 0) // compress_ratio).to(tl.int64)
            me = (tl.load(qsl + e + 1) - tl.load(qsl + e)).to(tl.int64)
            fits = (keys + ne <= workspace) & ((m + me) * (keys + ne) <= budget)
            if (fits == 0) & (e > start):
                # e does not fit the open range: close it, and e starts a new one.
                chunks = emit(chunk_bounds, cu_seq_lens, local_cu_seq_lens, qsl, start, e, m,
                              keys, lkeys, zkeys, chunks, max_chunks, budget, FIELDS, DCP)
                start = e
                m = tl.zeros([], tl.int64)
                keys = tl.zeros([], tl.int64)
                lkeys = tl.zeros([], tl.int64)
                zkeys = tl.zeros([], tl.int64)
                fits = (ne <= workspace) & (me * ne <= budget)
            tl.store(req_key_start + e, keys.to(tl.int32))
            tl.store(cu_seq_lens + start + e, keys.to(tl.int32))
            if DCP:
                tl.store(local_req_key_start + e, lkeys.to(tl.int32))
                tl.store(local_cu_seq_lens + start + e, lkeys.to(tl.int32))
                lkeys += dcp_local_count_tl(ne, dcp_world, dcp_rank, dcp_interleave)
                zkeys += dcp_local_count_tl(ne, dcp_world, 0, dcp_interleave)
            m += me
            keys += ne
            if fits == 0:
                # Too large to share a chunk even when alone: it is one.
                chunks = emit(chunk_bounds, cu_seq_lens, local_cu_seq_lens, qsl, start, e + 1,
                              m, keys, lkeys, zkeys, chunks, max_chunks, budget, FIELDS, DCP)
                start = e + 1
                m = tl.zeros([], tl.int64)
                keys = tl.zeros([], tl.int64)
                lkeys = tl.zeros([], tl.int64)
                zkeys = tl.zeros([], tl.int64)
        if start < k:
            chunks = emit(chunk_bounds, cu_seq_lens, local_cu_seq_lens, qsl, start, k, m, keys,
                          lkeys, zkeys, chunks, max_chunks, budget, FIELDS, DCP)
        tl.store(num_chunks_out, tl.minimum(chunks, max_chunks))
        clear(chunk_bounds, chunks * FIELDS, max_chunks * FIELDS, BLOCK)
        tl.debug_barrier()
        # Each token's key range: ks = the keys of its range before its request (this
        # rank's under DCP: local row bounds).
        if DCP:
            key_starts = local_req_key_start
        else:
            key_starts = req_key_start
        for t0 in range(0, num_tokens, BLOCK):
            t = t0 + offs
            in_step = t < num_tokens
            prefill = in_step & (t >= td) & (t < nt)
            req = tl.load(token_to_req + t, mask=prefill, other=0)
            pos = tl.load(positions + t, mask=prefill, other=0)
            ks = tl.load(key_starts + req, mask=prefill, other=0)
            visible = (tl.maximum(pos + 1, 0) // compress_ratio).to(tl.int32)
            if DCP:
                visible = dcp_local_count_tl(visible, dcp_world, dcp_rank, dcp_interleave)
            tl.store(ks_out + t, tl.where(prefill, ks, 0), mask=in_step)
            tl.store(ke_out + t, tl.where(prefill, ks + visible, 0), mask=in_step)

    return plan_kernel
