"""The paged-MQA-logits schedule: DeepGEMM's ``get_paged_mqa_logits_metadata`` (sm_90 path),
reimplemented to write into a fixed buffer (spec §4.9, deepgemm-flashmla.md §1.2).

For context lengths ``(B, n)`` (only the last column counts: the longest query token of each
request) the work is the units ``(b, atom, split)``: ``n_b = ceil(L_b / 256)`` splits of 256 keys
per request, ``A = ceil(n / atom)`` atoms per request (``atom = 2`` if ``n >= 2`` else 1),
request-major. With ``P_b`` the inclusive prefix of ``n_b`` and ``T = A * P_{B-1}`` units,
``q, r = divmod(T, num_sms)``, SM ``i`` starts at unit

* ``u_i = i*q + max(0, i - (num_sms - r))`` -- DeepGEMM v2.4+ (v2.6.1): the *last* ``r`` SMs
  take one unit more ("reversed remainder");
* ``u_i = i*q + min(i, r)`` -- ``legacy_remainder=True``, DeepGEMM v2.1-v2.3 (the reference
  engine's pinned DeepGEMM): the *first* ``r`` SMs take one more.

Row ``i`` of the output is ``u_i`` as ``(b*A + off // n_b, off % n_b)`` where ``b`` is the first
request with ``A*P_b > u_i`` and ``off = u_i - A*P_{b-1}``; ``(b*A, 0)`` when no request is left
(``b = B``), so row ``num_sms`` is the end sentinel ``(B*A, 0)``.

Example (v2.6.1): ``num_sms = 4``, ``n = 1``, lengths ``[1000, 300, 2100]`` -> splits
``[4, 2, 9]``, ``T = 15``, starts ``[0, 3, 7, 11]`` -> ``[[0,0],[0,3],[2,1],[2,5],[3,0]]``;
the legacy rule gives ``[[0,0],[1,0],[2,2],[2,6],[3,0]]``.

Any of these partitions covers every unit exactly once, so the logits are right under either
rule; the rule only moves the load. Lengths must be non-negative (DeepGEMM reads them as
uint32; the indexer builder clamps).
"""

from __future__ import annotations

import torch

from staticattn.kernels.runtime.compiled_launch import launch
from staticattn.kernels.runtime.deferred import lazy_jit

__all__ = ["paged_mqa_schedule", "SPLIT_KV"]

#: Keys per split: 4 pages of 64.
SPLIT_KV = 256

# Rows per step of the total pass; rows x SMs per step of the placement pass: a
# one-SM-per-step placement loop would take one step per SM for one long row.
_CHUNK = 1024
_ROWS = 128
_SMS_STEP = 16


def paged_mqa_schedule(
    backend: str,
    context_lens: torch.Tensor,
    out: torch.Tensor,
    *,
    legacy_remainder: bool = False,
) -> None:
    """Write the schedule of ``context_lens`` over ``out.shape[0] - 1`` SMs into ``out``.

    Parameters
    ----------
    context_lens : int32 device ``(B, n)``, non-negative, unit column stride
        Per-token visible lengths; only column ``n - 1`` is read. ``B = 0`` (a step
        without decode tokens) gives every row the end sentinel ``(0, 0)``.
    out : int32 device ``(num_sms + 1, 2)``, contiguous
        Row ``i``: ``(atom index, split index)`` where SM ``i`` starts; row ``num_sms`` is the
        end sentinel.
    legacy_remainder : bool
        False: DeepGEMM v2.4+ (v2.6.1); True: DeepGEMM v2.1-v2.3.

    Graph-safe with either backend. The Triton version is one program.
    """
    batch, next_n = context_lens.shape
    num_sms = out.shape[0] - 1
    atoms = -(-next_n // (2 if next_n >= 2 else 1))
    if backend == "triton":
        launch(_schedule_kernel(), (1,),
            context_lens, context_lens.stride(0), next_n - 1, batch, out, num_sms, atoms,
            LEGACY=legacy_remainder, SPLIT=SPLIT_KV,
            SM_BLOCK=max(16, 1 << num_sms.bit_length()), CHUNK=_CHUNK, ROWS=_ROWS,
            SMS_STEP=_SMS_STEP,
        )
        return
    if batch == 0:  # a static shape: no unit to place, every row is the sentinel (0, 0)
        out.zero_()
        return
    splits = (context_lens[:, -1].long() + SPLIT_KV - 1) // SPLIT_KV
    units = torch.cumsum(splits, 0) * atoms
    total = units[-1]
    q, r = total // num_sms, total % num_sms
    sm = torch.arange(num_sms + 1, device=out.device)
    extra = torch.minimum(sm, r) if legacy_remainder else (sm - (num_sms - r)).clamp(min=0)
    start = sm * q + extra
    req = torch.searchsorted(units, start, right=True)
    before = torch.where(req > 0, units[(req - 1).clamp(min=0)], 0)
    upto = torch.where(req < batch, units[req.clamp(max=batch - 1)], before)
    width = (upto - before) // atoms
    off = start - before
    has = width > 0
    safe = width.clamp(min=1)
    out[:, 0].copy_(req * atoms + torch.where(has, off // safe, 0))
    out[:, 1].copy_(torch.where(has, off % safe, 0))


@lazy_jit()
def _schedule_kernel(triton, tl):
    @triton.jit
    def schedule_kernel(
        lens, row_stride, last_col, batch, out, num_sms, atoms,
        LEGACY: tl.constexpr, SPLIT: tl.constexpr, SM_BLOCK: tl.constexpr,
        CHUNK: tl.constexpr, ROWS: tl.constexpr, SMS_STEP: tl.constexpr,
    ):
        # Pass 1: the total number of work units.
        total = tl.zeros([CHUNK], dtype=tl.int32)
        for c in range(0, batch, CHUNK):
            b = c + tl.arange(0, CHUNK)
            ctx = tl.load(lens + b * row_stride + last_col, mask=b < batch, other=0)
            total += (ctx + SPLIT - 1) // SPLIT
        units = tl.sum(total, axis=0) * atoms
        q = units // num_sms
        r = units - q * num_sms
        # start(s), the first unit of SM s: the remainder r goes to the first SMs (legacy)
        # or to the last ones (v2.4+): start(s) = s*q + min(s, r) or s*q + max(s - pivot, 0).
        pivot = num_sms - r
        q1 = tl.maximum(q, 1)
        # SMs starting at or past the end (and the sentinel row) get (B * A, 0).
        sm = tl.arange(0, SM_BLOCK)
        if LEGACY:
            sm_first = sm * q + tl.minimum(sm, r)
        else:
            sm_first = sm * q + tl.maximum(sm - pivot, 0)
        tail = (sm <= num_sms) & (sm_first >= units)
        tl.store(out + sm * 2, tl.zeros([SM_BLOCK], tl.int32) + batch * atoms, mask=tail)
        tl.store(out + sm * 2 + 1, tl.zeros([SM_BLOCK], tl.int32), mask=tail)
        # Pass 2: each row owns the units [A * P_{b-1}, A * P_b); the SMs whose start falls
        # there are a contiguous range found in closed form, so the work is O(B + SMs)
        # instead of a B x SMs comparison.
        carry = tl.sum(tl.zeros([ROWS], dtype=tl.int32), axis=0)
        for c in range(0, batch, ROWS):
            b = c + tl.arange(0, ROWS)
            in_batch = b < batch
            ctx = tl.load(lens + b * row_stride + last_col, mask=in_batch, other=0)
            splits = (ctx + SPLIT - 1) // SPLIT
            incl = tl.cumsum(splits, axis=0) + carry
            lo = (incl - splits) * atoms
            hi = incl * atoms
            # First SM whose start is >= x, inverting start(s) piece by piece.
            if LEGACY:
                s_lo = tl.where((lo + q) // (q + 1) <= r, (lo + q) // (q + 1),
                                tl.maximum((lo - r + q1 - 1) // q1, r + 1))
                s_hi = tl.where((hi + q) // (q + 1) <= r, (hi + q) // (q + 1),
                                tl.maximum((hi - r + q1 - 1) // q1, r + 1))
            else:
                s_lo = tl.where(
                    (q > 0) & ((lo + q1 - 1) // q1 <= pivot), (lo + q1 - 1) // q1,
                    tl.maximum((lo + pivot + q) // (q + 1), pivot + 1))
                s_lo = tl.where(lo <= 0, 0, s_lo)
                s_hi = tl.where(
                    (q > 0) & ((hi + q1 - 1) // q1 <= pivot), (hi + q1 - 1) // q1,
                    tl.maximum((hi + pivot + q) // (q + 1), pivot + 1))
                s_hi = tl.where(hi <= 0, 0, s_hi)
            count = tl.where(in_batch, s_hi - s_lo, 0)
            segs = tl.maximum(splits, 1)[:, None]
            # A (ROWS x SMS_STEP) tile per step: one long row may own every SM.
            for k0 in range(0, tl.max(count, axis=0), SMS_STEP):
                k = k0 + tl.arange(0, SMS_STEP)
                s = s_lo[:, None] + k[None, :]
                mine = k[None, :] < count[:, None]
                if LEGACY:
                    off = s * q + tl.minimum(s, r) - lo[:, None]
                else:
                    off = s * q + tl.maximum(s - pivot, 0) - lo[:, None]
                tl.store(out + s * 2, b[:, None] * atoms + off // segs, mask=mine)
                tl.store(out + s * 2 + 1, off % segs, mask=mine)
            carry += tl.sum(splits, axis=0)

    return schedule_kernel
