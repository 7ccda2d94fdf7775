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

from staticattn.kernels.lazy import lazy_jit

__all__ = ["paged_mqa_schedule", "SPLIT_KV"]

#: Keys per split: 4 pages of 64.
SPLIT_KV = 256

# Rows per step of the search pass (an SM_BLOCK x _CHUNK tile per step) and of the total
# pass (1-D): large enough that a 256-row batch takes a few steps, since each step waits on
# its loads; measured on an H200, 16-row steps made this kernel 25 us at 256 rows.
_CHUNK = 64
_CHUNK_SUM = 1024


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
    backend : {"torch", "triton"}
    context_lens : int32 device ``(B, n)``, ``B >= 1``, non-negative, unit column stride
        Per-token visible lengths; only column ``n - 1`` is read.
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
        _schedule_kernel()[(1,)](
            context_lens, context_lens.stride(0), next_n - 1, batch, out, num_sms, atoms,
            LEGACY=legacy_remainder, SPLIT=SPLIT_KV,
            SM_BLOCK=max(16, 1 << num_sms.bit_length()), CHUNK=_CHUNK, CHUNK_SUM=_CHUNK_SUM,
            num_warps=8,
        )
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


@lazy_jit
def _schedule_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def schedule_kernel(
        lens, row_stride, last_col, batch, out, num_sms, atoms,
        LEGACY: tl.constexpr, SPLIT: tl.constexpr, SM_BLOCK: tl.constexpr,
        CHUNK: tl.constexpr, CHUNK_SUM: tl.constexpr,
    ):
        # Pass 1: the total number of splits.
        total = tl.zeros([CHUNK_SUM], dtype=tl.int32)
        for c in range(0, batch, CHUNK_SUM):
            b = c + tl.arange(0, CHUNK_SUM)
            ctx = tl.load(lens + b * row_stride + last_col, mask=b < batch, other=0)
            total += (ctx + SPLIT - 1) // SPLIT
        units_total = tl.sum(total, axis=0) * atoms
        q = units_total // num_sms
        r = units_total - q * num_sms
        sm = tl.arange(0, SM_BLOCK)
        if LEGACY:
            start = sm * q + tl.minimum(sm, r)
        else:
            start = sm * q + tl.maximum(sm - (num_sms - r), 0)
        # Pass 2: for each SM start u, over the prefix P of splits (in units A*P):
        # count = #{b : A*P_b <= u} (the request it starts in), before = the largest such
        # P_b (P_{b-1}), upto = the smallest P_b with A*P_b > u (P_b).
        count = tl.zeros([SM_BLOCK], dtype=tl.int32)
        before = tl.zeros([SM_BLOCK], dtype=tl.int32)
        upto = tl.full([SM_BLOCK], 2147483647, tl.int32)
        carry = tl.zeros([CHUNK], dtype=tl.int32)
        for c in range(0, batch, CHUNK):
            b = c + tl.arange(0, CHUNK)
            in_batch = b < batch
            ctx = tl.load(lens + b * row_stride + last_col, mask=in_batch, other=0)
            splits = (ctx + SPLIT - 1) // SPLIT
            prefix = tl.cumsum(splits, axis=0) + carry
            carry += tl.sum(splits, axis=0)
            le = in_batch[None, :] & (prefix[None, :] * atoms <= start[:, None])
            gt = in_batch[None, :] & (prefix[None, :] * atoms > start[:, None])
            count += tl.sum(le.to(tl.int32), axis=1)
            before = tl.maximum(before, tl.max(tl.where(le, prefix[None, :], 0), axis=1))
            upto = tl.minimum(upto, tl.min(tl.where(gt, prefix[None, :], 2147483647), axis=1))
        width = tl.where(upto == 2147483647, 0, upto - before)
        off = start - before * atoms
        has = width > 0
        safe = tl.maximum(width, 1)
        row0 = count * atoms + tl.where(has, off // safe, 0)
        row1 = tl.where(has, off % safe, 0)
        rows = sm <= num_sms
        tl.store(out + sm * 2, row0, mask=rows)
        tl.store(out + sm * 2 + 1, row1, mask=rows)

    return schedule_kernel
