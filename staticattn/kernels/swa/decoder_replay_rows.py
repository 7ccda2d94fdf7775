"""The decoder-side replay sub-batch (``docs/spec/deepseek-v41.md`` §8.2): the layers past
the last kv source run on each request's last ``kept`` rows only.

Per request ``b`` (query length ``q_b``, sequence length ``L_b``, replay start ``rs_b``):
``kept_b = q_b`` for a decode (decodes never trim), ``min(q_b, W)`` for a prefill, 0 for
a padded request. The sub-batch holds those rows in request order:

* ``query_start_loc'``: the prefix sums of ``kept`` (padded requests repeat the total);
* ``rows[j]``: the batch token of sub-batch token ``j`` (the request's last ``kept`` rows),
  and the token's ``positions``, ``slot_mapping`` (SWA slots) and request;
* ``kv_start_b = max(rs_b, L_b - W)`` for a trimmed request (``kept_b < q_b``: the replay
  layers' KV below it was never written), else ``rs_b``; 0 for padded requests;
* ``step_counts' = [k, sum kept, D, Td]`` (the decodes keep their tokens).

Past the sub-batch's tokens: rows, positions and requests 0, slots -1. Example (§11 case 5,
W = 4): decode ``L = 10, q = 1`` and prefill ``L = 13, q = 9`` -> kept ``[1, 4]``, rows
``[0, 6, 7, 8, 9]``, ``query_start_loc' = [0, 1, 5]``, positions ``[9, 9, 10, 11, 12]``,
``kv_start = [0, 9]``.

Graph-safe, one launch: every program derives the request prefix sums itself (a step holds
few requests) and program 0 writes the per-request outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from staticattn.kernels.runtime.backend import triton_interpreted
from staticattn.kernels.runtime.compiled_launch import grid_size, launch, pow2_at_least
from staticattn.kernels.runtime.deferred import lazy_jit
from staticattn.kernels.staging.stage_inputs import COUNT_DECODES, COUNT_REQS
from staticattn.kernels.staging.step_counts import step_counts_jit

__all__ = ["ReplayViews", "replay_sub_batch"]


@dataclass(frozen=True, slots=True)
class ReplayViews:
    """What :func:`replay_sub_batch` writes.

    query_start_loc : int32 ``(R + 1,)``;  query_lens, kv_start : int32 ``(R,)``
    rows, token_to_req : int32 ``(T,)``;  positions, slot_mapping : int64 ``(T,)``
    step_counts : int32 ``(4,)``
    """

    query_start_loc: torch.Tensor
    query_lens: torch.Tensor
    kv_start: torch.Tensor
    rows: torch.Tensor
    token_to_req: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    step_counts: torch.Tensor


def replay_sub_batch(backend: str, out: ReplayViews, query_start_loc: torch.Tensor,
                     seq_lens: torch.Tensor, replay_start: torch.Tensor | None,
                     slot_mapping: torch.Tensor, positions: torch.Tensor, *, window: int,
                     num_reqs: int, num_tokens: int,
                     counts: tuple[int, int] | torch.Tensor) -> None:
    """Write the sub-batch of a batch of ``num_reqs`` requests and ``num_tokens`` tokens
    (static extents; module docstring).

    Parameters
    ----------
    query_start_loc : int32 ``(>= num_reqs + 1,)``;  seq_lens : int32 ``(>= num_reqs,)``
    replay_start : int32 ``(>= num_reqs,)`` or None (0)
    slot_mapping, positions : int64 ``(>= num_tokens,)``
    window : int
        ``W``.
    counts : ``(k, D)`` static ints, or the staging's ``step_counts``.
    """
    device_counts = isinstance(counts, torch.Tensor)
    if backend == "triton":
        k, d = (0, 0) if device_counts else counts
        block_t = 32 if triton_interpreted() else 16
        launch(_replay_kernel(), (grid_size(num_tokens, block_t),),
            query_start_loc, seq_lens,
            out.kv_start if replay_start is None else replay_start, slot_mapping, positions,
            counts if device_counts else out.step_counts, out.query_start_loc,
            out.query_lens, out.kv_start, out.rows, out.token_to_req, out.positions,
            out.slot_mapping, out.step_counts, k, d, num_reqs, num_tokens, window,
            DEVICE_COUNTS=device_counts, HAS_REPLAY=replay_start is not None,
            BLOCK_T=block_t, BLOCK_R=pow2_at_least(num_reqs + 1, 16),
        )
        return
    dev = seq_lens.device
    if device_counts:
        k, d = counts[COUNT_REQS].long(), counts[COUNT_DECODES].long()
    else:
        k, d = (torch.full((), c, device=dev) for c in counts)
    b = torch.arange(num_reqs, device=dev)
    qsl = query_start_loc[: num_reqs + 1].long()
    q = qsl[1:] - qsl[:-1]
    live = b < k
    kept = torch.where(live, torch.where(b < d, q, q.clamp(max=window)), 0)
    ends = torch.cumsum(kept, 0)
    starts = ends - kept
    total = ends[-1] if num_reqs else torch.zeros((), dtype=torch.long, device=dev)
    length = seq_lens[:num_reqs].long()
    rs = replay_start[:num_reqs].long() if replay_start is not None else torch.zeros_like(b)
    kv = torch.where(kept < q, torch.maximum(rs, length - window), rs)
    out.query_start_loc[: num_reqs + 1].copy_(torch.cat([total.new_zeros(1), ends]))
    out.query_lens[:num_reqs].copy_(kept)
    out.kv_start[:num_reqs].copy_(torch.where(live, kv, 0))
    decode_tokens = torch.where(b < d, kept, 0).sum()
    out.step_counts.copy_(torch.stack([k, total, d, decode_tokens]))
    j = torch.arange(num_tokens, device=dev)
    real = j < total
    req = torch.searchsorted(ends, j, right=True).clamp(max=max(num_reqs - 1, 0))
    row = qsl[req] + (q[req] - kept[req]) + (j - starts[req])
    row = torch.where(real, row, 0)
    out.rows[:num_tokens].copy_(row)
    out.token_to_req[:num_tokens].copy_(torch.where(real, req, 0))
    out.positions[:num_tokens].copy_(torch.where(real, positions[row], 0))
    out.slot_mapping[:num_tokens].copy_(torch.where(real, slot_mapping[row], -1))


@lazy_jit(step_counts_jit)
def _replay_kernel(triton, tl, live_count, SLOT_REQS, SLOT_DECODES, **_):
    @triton.jit(do_not_specialize=["k_static", "d_static", "num_reqs", "num_tokens", "window"])
    def replay_kernel(qsl, seq_lens, replay_start, slot_mapping, positions, counts, qsl_out,
                      query_lens_out, kv_start_out, rows_out, token_to_req_out, positions_out,
                      slots_out, counts_out, k_static, d_static, num_reqs, num_tokens, window,
                      DEVICE_COUNTS: tl.constexpr, HAS_REPLAY: tl.constexpr,
                      BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr):
        k = live_count(counts, SLOT_REQS, k_static, DEVICE_COUNTS)
        d = live_count(counts, SLOT_DECODES, d_static, DEVICE_COUNTS)
        b = tl.arange(0, BLOCK_R)
        in_r = b < num_reqs
        live = in_r & (b < k)
        start = tl.load(qsl + b, mask=in_r, other=0)
        q = tl.load(qsl + b + 1, mask=in_r, other=0) - start
        kept = tl.where(live, tl.where(b < d, q, tl.minimum(q, window)), 0)
        ends = tl.cumsum(kept, 0)
        total = tl.sum(kept, 0)
        if tl.program_id(0) == 0:
            length = tl.load(seq_lens + b, mask=live, other=0)
            if HAS_REPLAY:
                rs = tl.load(replay_start + b, mask=live, other=0)
            else:
                rs = tl.zeros([BLOCK_R], tl.int32)
            kv = tl.where(kept < q, tl.maximum(rs, length - window), rs)
            tl.store(qsl_out + b + 1, ends, mask=in_r)
            tl.store(qsl_out + b, tl.zeros([BLOCK_R], tl.int32), mask=b == 0)
            tl.store(query_lens_out + b, kept, mask=in_r)
            tl.store(kv_start_out + b, tl.where(live, kv, 0), mask=in_r)
            decode_tokens = tl.sum(tl.where(b < d, kept, 0), 0)
            c = tl.arange(0, 4)
            tl.store(counts_out + c, tl.where(c == 0, k, tl.where(
                c == 1, total, tl.where(c == 2, d, decode_tokens))))
        j = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        in_t = j < num_tokens
        real = in_t & (j < total)
        # The request of sub-batch token j: the requests ending at or before it.
        before = (ends[None, :] <= j[:, None]) & in_r[None, :]
        req = tl.minimum(tl.sum(before.to(tl.int32), 1), num_reqs - 1)
        # Its first sub-batch token and its kept and query lengths, from the vectors.
        mine = b[None, :] == req[:, None]
        first = tl.sum(tl.where(mine, ends - kept, 0), 1)
        trim = tl.sum(tl.where(mine, q - kept, 0), 1)
        row = tl.sum(tl.where(mine, start, 0), 1) + trim + (j - first)
        row = tl.where(real, row, 0)
        tl.store(rows_out + j, row, mask=in_t)
        tl.store(token_to_req_out + j, tl.where(real, req, 0), mask=in_t)
        tl.store(positions_out + j, tl.load(positions + row, mask=real, other=0), mask=in_t)
        tl.store(slots_out + j, tl.load(slot_mapping + row, mask=real, other=-1), mask=in_t)

    return replay_kernel
