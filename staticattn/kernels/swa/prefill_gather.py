"""The prefill requests of a sparse sliding-window step: gather lengths and chunk plans.

Gather length (spec §6.7, ``docs/spec/vllm-0.33-extras.md`` §2.5): a prefill request ``r``
with query length ``q`` and context ``c = L_r - q`` gathers all its query tokens plus the
up-to-``W - 1`` context tokens its first query token can still see, not below its bounded
replay start ``rs`` (``deepseek-v41.md`` §7.4; 0 without replay):
``gather_len = q + min(max(c - rs, 0), W - 1)``. Example (W = 128): ``L = 50, q = 50`` ->
50; ``L = 1000, q = 500`` -> 627; ``L = 300, q = 100`` -> 227; ``L = 12, q = 8, rs = 4``
(W = 4) -> 8.

Row ``i`` is request ``D + i``; the kernel also writes that request's sequence length, so a
build whose split is decided on the device (``step_counts``) hands out ``prefill_seq_lens``
without slicing at a host-known ``D``. Rows past the real prefills get 0 and 0.

Chunk plans (``vllm-0.33-extras.md`` §2.5), one per planned layer type, over the prefill
requests: per request ``c_b = L_b // R`` (0 for a type without compressed entries) and
``g_b = q_b + clamp(L_b - q_b, 0, W - 1)`` (replay ignored: an upper bound); with the area
budget ``A = C ((cdiv(max_model_len, R) if compressed else 0) + W + max_num_batched_tokens)``
a chunk starts at ``s`` with ``(n, g) = (c_s, g_s)`` and takes request ``e`` while
``(e - s + 1) (max(n, c_e) + max(g, g_e)) <= A``; it is the row ``(s, e_end, n, n + g)``
(``N``, ``M``), request indices relative to the first prefill. Rows past the plan's count are
0. Example A (``W = 4``, ratio 4): prefills ``L = [10, 5]``, ``q = [3, 5]`` -> ``c = [2, 1]``,
``g = [6, 5]`` -> ``[(0, 2, 2, 8)]``.

Graph-safe like every kernel here. The Triton version is one launch: programs over blocks
of prefill rows for the lengths, then one program per plan (the greedy plan is sequential
over the prefill requests, which are few). A new prefill count never compiles a new
specialisation (the reference re-specialises per power of two of the count).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from staticattn.kernels.runtime.compiled_launch import grid_size, launch
from staticattn.kernels.runtime.deferred import lazy_jit
from staticattn.kernels.staging.stage_inputs import COUNT_DECODES, COUNT_REQS
from staticattn.kernels.staging.step_counts import step_counts_jit

__all__ = ["ChunkPlanViews", "prefill_gather_lens"]

_BLOCK = 128
#: Bits per packed plan ratio (:attr:`ChunkPlanViews.packed_ratios`).
_RATIO_BITS = 8


@dataclass(frozen=True, slots=True)
class ChunkPlanViews:
    """Where the chunk plans go, and what they are planned for.

    chunks : int32 ``(num_plans, C, 4)``, contiguous: plan ``j``'s rows ``(start, end, N, M)``
    num_chunks : int32 ``(num_plans,)``
    ratios : tuple of int, one per plan: the compress ratio counted by the plan, 0 for a
        type without compressed entries (``has_compressed`` false), at most 255
    budget_base : int
        ``W + max_num_batched_tokens``
    max_model_len, chunk_size : int
        For the budget ``A = chunk_size * ((cdiv(max_model_len, R) if R else 0) +
        budget_base)``.
    """

    chunks: torch.Tensor
    num_chunks: torch.Tensor
    ratios: tuple[int, ...]
    budget_base: int
    max_model_len: int
    chunk_size: int

    @property
    def packed_ratios(self) -> int:
        """The ratios packed into one int, plan ``j``'s in bits ``[8j, 8j + 8)``."""
        return sum(r << (_RATIO_BITS * j) for j, r in enumerate(self.ratios))

    def budget(self, ratio: int) -> int:
        """The area budget of a plan counting ``ratio`` (0: no compressed entries)."""
        compressed = -(-self.max_model_len // ratio) if ratio else 0
        return self.chunk_size * (compressed + self.budget_base)


def prefill_gather_lens(
    backend: str,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_decodes: int,
    num_prefills: int,
    window: int,
    out: torch.Tensor,
    seq_lens_out: torch.Tensor | None = None,
    step_counts: torch.Tensor | None = None,
    *,
    replay_start: torch.Tensor | None = None,
    plans: ChunkPlanViews | None = None,
) -> None:
    """Write ``out[i]``, the gather length of request ``num_decodes + i``, for ``i <
    num_prefills``, and with ``plans`` the chunk plans.

    Parameters
    ----------
    seq_lens : int32 ``(>= num_decodes + num_prefills,)``
    query_start_loc : int32 ``(>= num_decodes + num_prefills + 1,)``
    num_decodes, num_prefills : int
        Static: the prefills are requests ``[num_decodes, num_decodes + num_prefills)``. With
        ``step_counts``, ``num_decodes`` is ignored and ``num_prefills`` is the static extent
        of the rows (the real ones are ``[D, k)`` from the device).
    window : int
        Sliding window ``W``.
    out : int32 ``(>= num_prefills,)``
    seq_lens_out : int32 ``(>= num_prefills,)`` or None
        Also write each row's sequence length.
    step_counts : int32 device ``(4,)`` or None
        The staging's ``[k, nt, D, Td]``.
    replay_start : int32 ``(>= num_decodes + num_prefills,)`` or None
        Bounded replay starts by request (None: 0).
    plans : ChunkPlanViews or None
        Also plan the prefill chunks (``C >= num_prefills`` rows per plan).
    """
    if num_prefills == 0:
        return
    if backend == "triton":
        blocks = grid_size(num_prefills, _BLOCK)
        num_plans = 0 if plans is None else len(plans.ratios)
        i32 = out
        launch(_gather_lens_kernel(), (blocks + num_plans,),
            out, seq_lens_out if seq_lens_out is not None else i32, seq_lens, query_start_loc,
            i32 if step_counts is None else step_counts,
            i32 if replay_start is None else replay_start,
            i32 if plans is None else plans.chunks, i32 if plans is None else plans.num_chunks,
            num_decodes, num_prefills, window, blocks,
            0 if plans is None else plans.chunks.shape[1],
            0 if plans is None else plans.packed_ratios,
            0 if plans is None else plans.budget_base,
            0 if plans is None else plans.max_model_len,
            0 if plans is None else plans.chunk_size,
            WRITE_SEQ_LENS=seq_lens_out is not None, DEVICE_COUNTS=step_counts is not None,
            HAS_REPLAY=replay_start is not None, BLOCK=_BLOCK,
        )
        return
    dev = seq_lens.device
    i = torch.arange(num_prefills, device=dev)
    if step_counts is None:
        first = torch.full((), num_decodes, device=dev)
        k = first + num_prefills
    else:
        first, k = step_counts[COUNT_DECODES], step_counts[COUNT_REQS]
    live = first + i < k
    r = torch.where(live, first + i, 0)
    query_lens = query_start_loc[r + 1] - query_start_loc[r]
    context = seq_lens[r] - query_lens
    if replay_start is not None:
        context = (context - replay_start[r]).clamp(min=0)
    gather = query_lens + torch.clamp(context, max=window - 1)
    out[:num_prefills].copy_(torch.where(live, gather, 0))
    if seq_lens_out is not None:
        seq_lens_out[:num_prefills].copy_(torch.where(live, seq_lens[r], 0))
    if plans is not None:
        _plan_torch(plans, seq_lens[r], query_lens, live, window, num_prefills)


def _plan_torch(plans: ChunkPlanViews, seq_lens, query_lens, live, window: int,
                num_prefills: int) -> None:
    """The greedy plans with tensor ops: a static loop over the prefill row slots, each
    plan's state as 0-d tensors updated under masks (nothing read back)."""
    dev = seq_lens.device
    seq, q = seq_lens.long(), query_lens.long()
    g_of = q + (seq - q).clamp(min=0, max=window - 1)
    rows = plans.chunks.shape[1]
    for j, ratio in enumerate(plans.ratios):
        c_of = seq // ratio if ratio else torch.zeros_like(seq)
        budget = plans.budget(ratio)
        table = torch.zeros(rows + 1, 4, dtype=torch.int64, device=dev)
        zero = torch.zeros((), dtype=torch.int64, device=dev)
        start, n, g, count = zero, zero, zero, zero
        for e in range(num_prefills):
            grow = live[e] & (e > start)
            nn, gg = torch.maximum(n, c_of[e]), torch.maximum(g, g_of[e])
            close = grow & ((e - start + 1) * (nn + gg) > budget)
            at = torch.where(close, count, rows).reshape(1)
            table.index_copy_(0, at, torch.stack([start, zero + e, n, n + g])[None])
            count = count + close
            fresh = live[e] & ((e == start) | close)
            start = torch.where(close, e, start)
            n = torch.where(fresh, c_of[e], torch.where(grow, nn, n))
            g = torch.where(fresh, g_of[e], torch.where(grow, gg, g))
        end = live.sum()
        last = start < end
        at = torch.where(last, count, rows).reshape(1)
        table.index_copy_(0, at, torch.stack([start, end, n, n + g])[None])
        count = count + last
        plans.chunks[j].copy_(table[:rows])
        plans.num_chunks[j : j + 1].copy_(count.reshape(1))


@lazy_jit(step_counts_jit)
def _gather_lens_kernel(triton, tl, live_count, SLOT_REQS, SLOT_DECODES, **_):
    @triton.jit(do_not_specialize=["num_decodes", "num_prefills", "window", "gather_blocks",
                                   "plan_rows", "packed_ratios", "budget_base",
                                   "max_model_len", "chunk_size"])
    def prefill_kernel(out, seq_lens_out, seq_lens, qsl, counts, replay_start, chunks,
                       num_chunks, num_decodes, num_prefills, window, gather_blocks,
                       plan_rows, packed_ratios, budget_base, max_model_len, chunk_size,
                       WRITE_SEQ_LENS: tl.constexpr, DEVICE_COUNTS: tl.constexpr,
                       HAS_REPLAY: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        first = live_count(counts, SLOT_DECODES, num_decodes, DEVICE_COUNTS)
        k = live_count(counts, SLOT_REQS, num_decodes + num_prefills, DEVICE_COUNTS)
        if pid < gather_blocks:
            i = pid * BLOCK + tl.arange(0, BLOCK)
            rows = i < num_prefills
            live = rows & (first + i < k)
            r = first + i
            query_len = (tl.load(qsl + r + 1, mask=live, other=0)
                         - tl.load(qsl + r, mask=live, other=0))
            seq_len = tl.load(seq_lens + r, mask=live, other=0)
            context = seq_len - query_len
            if HAS_REPLAY:
                context = tl.maximum(context - tl.load(replay_start + r, mask=live, other=0),
                                     0)
            gather = query_len + tl.minimum(context, window - 1)
            tl.store(out + i, tl.where(live, gather, 0), mask=rows)
            if WRITE_SEQ_LENS:
                tl.store(seq_lens_out + i, seq_len, mask=rows)
        else:
            # Plan j: its ratio (0 = no compressed entries) and area budget.
            j = pid - gather_blocks
            ratio = ((packed_ratios >> (8 * j)) & 255).to(tl.int32)
            compressed = tl.where(ratio > 0, (max_model_len + ratio - 1) // tl.maximum(ratio, 1),
                                  0)
            budget = chunk_size * (compressed + budget_base)
            plan = chunks + j * plan_rows * 4
            field = tl.arange(0, 4)
            start = first
            n = tl.zeros([], tl.int32)
            g = tl.zeros([], tl.int32)
            count = tl.zeros([], tl.int32)
            for e in range(first, k):
                length = tl.load(seq_lens + e)
                q = tl.load(qsl + e + 1) - tl.load(qsl + e)
                c_e = tl.where(ratio > 0, length // tl.maximum(ratio, 1), 0)
                g_e = q + tl.minimum(tl.maximum(length - q, 0), window - 1)
                nn = tl.maximum(n, c_e)
                gg = tl.maximum(g, g_e)
                if e > start:
                    if (e - start + 1) * (nn + gg) > budget:
                        row = tl.where(field == 0, start - first, e - first)
                        row = tl.where(field == 2, n, tl.where(field == 3, n + g, row))
                        tl.store(plan + count * 4 + field, row,
                                 mask=count + field * 0 < plan_rows)
                        count += 1
                        start = e
                        n = c_e
                        g = g_e
                    else:
                        n = nn
                        g = gg
                else:
                    n = c_e
                    g = g_e
            if start < k:
                row = tl.where(field == 0, start - first, k - first)
                row = tl.where(field == 2, n, tl.where(field == 3, n + g, row))
                tl.store(plan + count * 4 + field, row,
                         mask=count + field * 0 < plan_rows)
                count += 1
            tl.store(num_chunks + j, count)
            offs = tl.arange(0, BLOCK)
            for r0 in range(count * 4, plan_rows * 4, BLOCK):
                tl.store(plan + r0 + offs, tl.zeros([BLOCK], tl.int32),
                         mask=r0 + offs < plan_rows * 4)

    return prefill_kernel
