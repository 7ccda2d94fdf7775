"""Oracle of the host-side planning functions, written from the words of spec §2-§3, §4.6
and the seed page, one plain loop at a time (no numpy or torch vector tricks).

Below the oracles: hypothesis strategies of planning inputs shared by the planning tests,
and a helper that builds a small CPU :class:`Batch` from plain lists.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from staticattn.builders import Batch

# ---------------------------------------------------------------------------- split (§3.2)


def split_decodes_and_prefills(
    query_lens: list[int],
    num_actual_tokens: int,
    max_query_len: int,
    threshold: int,
    require_uniform: bool,
    treat_short_extends_as_decodes: bool,
    is_prefilling: list[bool] | None,
) -> tuple[int, int, int, int]:
    num_reqs = len(query_lens)
    everything_decodes = (num_reqs, 0, num_actual_tokens, 0)
    # Step 1: short maximum, no uniformity demand (or threshold 1), short extends allowed.
    if (max_query_len <= threshold and (not require_uniform or threshold <= 1)
            and treat_short_extends_as_decodes):
        return everything_decodes
    if num_reqs == 0:
        return everything_decodes
    # Step 2: the first request is long: nothing is a decode.
    if query_lens[0] > threshold:
        return (0, num_reqs, 0, num_actual_tokens)
    # Step 3.
    is_prefill = []
    if require_uniform:
        padded_uniform = True
        for q in query_lens:
            if q != query_lens[0] and q != 0:
                padded_uniform = False
        if padded_uniform:
            return everything_decodes
        for q in query_lens:
            is_prefill.append(q != query_lens[0])
    else:
        for q in query_lens:
            is_prefill.append(q > threshold)
    # Step 4.
    if not treat_short_extends_as_decodes:
        for b in range(num_reqs):
            if is_prefilling[b]:
                is_prefill[b] = True
    # Step 5.
    first = None
    for b in range(num_reqs):
        if is_prefill[b]:
            first = b
            break
    if first is None:
        return everything_decodes
    decode_tokens = 0
    for b in range(first):
        decode_tokens += query_lens[b]
    return (first, num_reqs - first, decode_tokens, num_actual_tokens - decode_tokens)


def split_decodes_prefills_and_extends(
    query_lens: list[int], seq_lens: list[int], num_actual_tokens: int, max_query_len: int,
    threshold: int,
) -> tuple[int, int, int, int, int, int]:
    num_reqs = len(query_lens)
    everything_decodes = (num_reqs, 0, 0, num_actual_tokens, 0, 0)
    if max_query_len <= threshold:
        return everything_decodes
    first_long = first_fresh_long = None
    for b in range(num_reqs):
        long = query_lens[b] > threshold
        if long and first_long is None:
            first_long = b
        if long and seq_lens[b] == query_lens[b] and first_fresh_long is None:
            first_fresh_long = b
    if first_long is None:
        return everything_decodes
    decode_tokens = sum(query_lens[:first_long])
    if first_fresh_long is None:
        return (first_long, num_reqs - first_long, 0, decode_tokens,
                num_actual_tokens - decode_tokens, 0)
    before_prefills = sum(query_lens[:first_fresh_long])
    prefill_tokens = num_actual_tokens - before_prefills
    return (first_long, first_fresh_long - first_long, num_reqs - first_fresh_long,
            decode_tokens, before_prefills - decode_tokens, prefill_tokens)


# -------------------------------------------------------------------------- reorder (§3.1)


def reorder_region(scheduled: int, computed: int, prompt: int, threshold: int) -> int:
    has_context = computed > 0
    if not has_context:
        return 3
    if scheduled > threshold:
        return 2
    if computed >= prompt:
        return 0
    return 1


def reorder(requests: list[tuple[int, int, int]], threshold: int) -> tuple[list[int], bool]:
    """Final order (original indices per position) and whether anything moved.

    Region r takes the positions after every earlier region's requests; a request already in
    its region's positions stays; the misplaced positions, in order, take the misplaced
    requests sorted by region then original position."""
    regions = [reorder_region(s, c, p, threshold) for (s, c, p) in requests]
    target = []
    for r in range(4):
        for region in regions:
            if region == r:
                target.append(r)
    misplaced_positions = [i for i in range(len(requests)) if regions[i] != target[i]]
    movers = []
    for r in range(4):
        for i in misplaced_positions:
            if regions[i] == r:
                movers.append(i)
    order = list(range(len(requests)))
    for position, mover in zip(misplaced_positions, movers, strict=True):
        order[position] = mover
    return order, bool(misplaced_positions)


# ------------------------------------------------------------------------- chunking (§3.3)


def split_prefill_chunks(seq_lens: list[int], workspace: int, offset: int
                         ) -> list[tuple[int, int]] | None:
    """None when a single request is longer than the workspace (an error)."""
    for s in seq_lens:
        if s > workspace:
            return None
    chunks = []
    start, total = 0, 0
    for i, s in enumerate(seq_lens):
        if total + s > workspace:
            chunks.append((start + offset, i + offset))
            start, total = i, 0
        total += s
    if start < len(seq_lens):
        chunks.append((start + offset, len(seq_lens) + offset))
    return chunks


def split_indexer_prefill_chunks(
    keys: list[int], queries: list[int], workspace: int, max_logits_bytes: int, offset: int
) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    budget = max_logits_bytes // 4
    out = []
    s = 0
    while s < len(keys):
        m = n = 0
        e = s
        while e < len(keys):
            if n + keys[e] <= workspace and (m + queries[e]) * (n + keys[e]) <= budget:
                m += queries[e]
                n += keys[e]
                e += 1
            else:
                break
        if e == s:
            m, n = queries[s], keys[s]
            e = s + 1
        max_q = max(1, budget // n) if n > 0 else m
        q0 = 0
        while q0 < m:
            out.append(((s + offset, e + offset), (q0, q0 + min(max_q, m - q0))))
            q0 += max_q
        s = e
    return out


# ------------------------------------------------------------------ local attention (seed)


def local_attention(query_lens: list[int], seq_lens: list[int], chunk: int, block_size: int,
                    block_table: list[list[int]]):
    """Per virtual request: (query length, key length, block row), walking the query
    positions of each request chunk by chunk."""
    out = []
    for b in range(len(query_lens)):
        q, length = query_lens[b], seq_lens[b]
        width = len(block_table[b])
        if q == 0:
            chunk_ids = [(length - 1) // chunk if length > 0 else 0]
            counts = {chunk_ids[0]: 0}
        else:
            chunk_ids, counts = [], {}
            for p in range(length - q, length):
                c = p // chunk
                if c not in counts:
                    chunk_ids.append(c)
                    counts[c] = 0
                counts[c] += 1
        for c in chunk_ids:
            start = c * chunk
            keys = min(length, start + chunk) - start if length > 0 else 0
            row = []
            for i in range(chunk // block_size):
                col = start // block_size + i
                col = min(max(col, 0), width - 1)
                row.append(block_table[b][col])
            out.append((counts[c], keys, row))
    return out


# --------------------------------------------------------------- context parallel (seed)


def dcp_local_seq_lens(length: int, dcp_size: int, interleave: int) -> list[int]:
    """Tokens per rank: groups of I positions are dealt round-robin, group k to rank
    k % dcp_size; the last group may be short."""
    counts = [0] * dcp_size
    group = 0
    while group * interleave < length:
        counts[group % dcp_size] += min(interleave, length - group * interleave)
        group += 1
    return counts


# ------------------------------------------------------------------------- conv1d (seed)


def conv1d(query_start_loc: list[int], block_m: int):
    """(nums, mlist, offsetlist)."""
    nums, mlist, offsets = [], [], []
    for b in range(len(query_start_loc) - 1):
        q = query_start_loc[b + 1] - query_start_loc[b]
        programs = 0
        while programs * block_m < q:
            programs += 1
        nums.append(programs)
        for j in range(programs):
            mlist.append(b)
            offsets.append(j)
    return nums, mlist, offsets


# ------------------------------------------------------------------- fast prefill (seed)


def fast_prefill_query_start_loc(query_start_loc: list[int], indices: list[int]) -> list[int]:
    counts = [0] * (len(query_start_loc) - 1)
    for t in indices:
        for b in range(len(counts)):
            if query_start_loc[b] <= t < query_start_loc[b + 1]:
                counts[b] += 1
                break
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return out


# ------------------------------------------------------------------ validation (host step)


def host_step_errors(
    query_lens: list[int], seq_lens: list[int], slots: list[int], *, max_num_seqs: int,
    max_num_batched_tokens: int, max_model_len: int, threshold: int,
    require_decode_first: bool,
) -> set[str]:
    """Names of the error types the step's defects call for (empty: the step is valid)."""
    errors = set()
    if len(query_lens) > max_num_seqs or len(slots) > max_num_batched_tokens:
        errors.add("CapacityError")
    if any(q < 0 for q in query_lens) or sum(query_lens) != len(slots):
        errors.add("InvalidBatchError")
    if any(s < 0 for s in seq_lens) or any(q > s for q, s in zip(query_lens, seq_lens,
                                                                 strict=True)):
        errors.add("InvalidBatchError")
    if any(s > max_model_len for s in seq_lens):
        errors.add("CapacityError")
    if any(t < -1 for t in slots):
        errors.add("InvalidBatchError")
    if require_decode_first:
        seen_long = False
        for q in query_lens:
            if q > threshold:
                seen_long = True
            elif q > 0 and seen_long:
                errors.add("InvalidBatchError")
    return errors


# ============================================================== generated planning inputs


@dataclass
class PlanCase:
    """A batch as plain lists: real requests then padding rows (query 0, sequence 0)."""

    query_lens: list[int]
    seq_lens: list[int]
    is_prefilling: list[bool]
    num_actual_tokens: int
    max_query_len: int
    threshold: int


@st.composite
def plan_cases(draw) -> PlanCase:
    """Mixed decode / short extend / long extend / prefill batches (reordered or shuffled),
    padded uniform batches with query-length-0 rows, MTP decodes, oversized single
    requests."""
    next_n = draw(st.integers(1, 4))
    threshold = draw(st.sampled_from([1, next_n, draw(st.integers(1, 6))]))
    kind = draw(st.sampled_from(["mixed", "uniform_padded", "mtp", "oversized"]))
    q, s, pre = [], [], []

    def context(lo: int = 1) -> int:
        return draw(st.integers(lo, 3000))

    if kind == "uniform_padded":
        k = draw(st.integers(1, 12))
        pad = draw(st.integers(0, 6))
        q = [next_n] * k + [0] * pad
        s = [next_n + context() for _ in range(k)] + [0] * pad
        pre = [False] * (k + pad)
        extra = (k + pad) * next_n - k * next_n
    else:
        kinds = {
            "mixed": ["decode", "short_extend", "long_extend", "prefill", "tiny_prefill"],
            "mtp": ["decode"],
            "oversized": ["decode", "huge"],
        }[kind]
        rows = draw(st.lists(st.sampled_from(kinds), min_size=1, max_size=12))
        if kind == "oversized":
            rows = [r for r in rows if r != "huge"] + ["huge"]
        if draw(st.booleans()):
            order = ["decode", "short_extend", "long_extend", "huge", "prefill", "tiny_prefill"]
            rows.sort(key=lambda r: 3 if r == "tiny_prefill" else order.index(r))
        for row in rows:
            if row == "decode":
                n = draw(st.integers(1, next_n))
                length, prefilling = n + context(), False
            elif row == "short_extend":
                n = draw(st.integers(1, threshold))
                length, prefilling = n + context(), True
            elif row == "long_extend":
                n = draw(st.integers(threshold + 1, threshold + 300))
                length, prefilling = n + context(), draw(st.booleans())
            elif row in ("prefill", "tiny_prefill"):
                n = draw(st.integers(threshold + 1, threshold + 300) if row == "prefill"
                         else st.integers(1, threshold))
                length, prefilling = n, True
            else:
                n = draw(st.integers(4000, 20000))
                length, prefilling = n + context(0), True
            q.append(n)
            s.append(length)
            pre.append(prefilling)
        pad = draw(st.integers(0, 3))
        q += [0] * pad
        s += [0] * pad
        pre += [False] * pad
        extra = draw(st.integers(0, 8))
    num_tokens = sum(q) + extra
    max_q = max(q) + (draw(st.integers(0, 3)) if draw(st.booleans()) else 0)
    return PlanCase(q, s, pre, num_tokens, max_q, threshold)


def make_batch(
    query_lens: list[int],
    seq_lens: list[int],
    *,
    num_actual_tokens: int | None = None,
    max_query_len: int | None = None,
    is_prefilling: list[bool] | None = None,
    block_table: list[list[int]] | None = None,
) -> Batch:
    """A CPU batch of small tensors (no arena): device fields and host fields alias."""
    qsl = [0]
    for q in query_lens:
        qsl.append(qsl[-1] + q)
    tokens = qsl[-1] if num_actual_tokens is None else num_actual_tokens
    qsl_t = torch.tensor(qsl, dtype=torch.int32)
    lens_t = torch.tensor(seq_lens, dtype=torch.int32)
    if block_table is None or not query_lens:
        table = torch.zeros(len(query_lens), 1, dtype=torch.int32)
    else:
        table = torch.tensor(block_table, dtype=torch.int32).reshape(len(query_lens), -1)
    return Batch(
        query_start_loc=qsl_t,
        query_start_loc_cpu=qsl_t,
        seq_lens=lens_t,
        seq_lens_cpu=lens_t,
        num_reqs=len(query_lens),
        num_actual_tokens=tokens,
        max_query_len=(max(query_lens, default=0) if max_query_len is None
                       else max_query_len),
        max_seq_len=max(seq_lens, default=0),
        block_table=table,
        slot_mapping=torch.full((tokens,), -1, dtype=torch.int64),
        is_prefilling=(None if is_prefilling is None
                       else torch.tensor(is_prefilling, dtype=torch.bool)),
    )


def batch_of(case: PlanCase, *, with_prefilling: bool = True) -> Batch:
    return make_batch(case.query_lens, case.seq_lens, num_actual_tokens=case.num_actual_tokens,
                      max_query_len=case.max_query_len,
                      is_prefilling=case.is_prefilling if with_prefilling else None)
