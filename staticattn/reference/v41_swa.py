"""Oracle of the SWA builder's V4.1 outputs and of the V4/V4.1 paged prefill rows, in plain loops
over host lists, written from the spec's words only: ``docs/spec/deepseek-v41.md`` §7.4
(windows, gather lengths, the replay clamp), §8.1 (``replay_start``: prefilling requests only),
``vllm-0.33-extras.md`` §2.3-§2.5 (paged prefill rows, invalid tokens, the chunk plan) and
§3.3-§3.4 (image spans: a prefill token inside a span sees ``left`` more tokens behind and
``right`` ahead).

The layout of a token bucket (a mixed build) is staticattn's, as
:mod:`~staticattn.reference.mixed` states: rows past the real step are -1 with length 0,
per-request rows past the real prefills 0; the chunk tables hold ``max_num_seqs`` rows, zeros
past the plan; a bucket's plan covers its real prefill requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from staticattn.reference.assertions import holds, same

if TYPE_CHECKING:
    from staticattn.arena import ArenaConfig

__all__ = ["CHUNK_SIZE", "SWAStep", "assert_eager", "assert_mixed", "chunk_plan",
           "decode_rows", "effective_replay", "expected_eager", "expected_mixed", "gather_len",
           "image_window", "num_decodes", "plan_ratio", "plans", "prefill_rows", "slot",
           "span_reach", "table", "window"]

#: The reference's PREFILL_CHUNK_SIZE (deepseek-v41.md §2.3).
CHUNK_SIZE = 4


@dataclass
class SWAStep:
    """The host view of a step: per request (padded ones included) its query and sequence
    length and replay start; per token its slot; SWA block-table rows; image spans
    ``(request, first, last)``."""

    query_lens: list[int]
    seq_lens: list[int]
    replay_start: list[int]
    slots: list[int]
    swa_table: list[list[int]]
    image_spans: list[tuple[int, int, int]] = field(default_factory=list)

    def tokens(self) -> tuple[list[int], list[int], list[int]]:
        """``(qsl, owner, position)``: position ``L - q + j`` of the j-th token of a request."""
        qsl, owner, position = [0], [], []
        for b, (q, length) in enumerate(zip(self.query_lens, self.seq_lens)):
            qsl.append(qsl[-1] + q)
            for j in range(q):
                owner.append(b)
                position.append(length - q + j)
        return qsl, owner, position


def num_decodes(query_lens: list[int], threshold: int) -> int:
    """The leading requests whose query is at most the threshold."""
    d = 0
    while d < len(query_lens) and query_lens[d] <= threshold:
        d += 1
    return d


def slot(row: list[int], x: int, bs: int) -> int:
    """Flat slot of position ``x`` through a block-table row of ``bs``-token blocks."""
    return row[x // bs] * bs + x % bs


def window(row: list[int], p: int, w: int, bs: int, replay_start: int,
           width: int) -> tuple[list[int], int]:
    """§7.4: ``start = max(p - W + 1, replay_start)``, ``len = p - start + 1``, the slots of
    ``start .. p`` then -1 up to ``width``."""
    start = max(p - w + 1, replay_start, 0)
    n = max(p - start + 1, 0)
    out = [-1] * width
    for o in range(n):
        out[o] = slot(row, start + o, bs)
    return out, n


def span_reach(spans: list[tuple[int, int, int]], b: int, p: int, mit: int) -> tuple[int, int]:
    """extras §3.3: ``left = min(p - s, mit - 1)``, ``right = min(e - p, mit)`` for each span
    ``(s, e)`` of request ``b`` with ``s <= p <= e``, the last one winning; 0, 0 outside."""
    left = right = 0
    for owner, s, e in spans:
        if owner == b and s <= p <= e:
            left, right = min(p - s, mit - 1), min(e - p, mit)
    return left, right


def image_window(row: list[int], p: int, w: int, bs: int, replay_start: int, width: int,
                 reach: tuple[int, int]) -> tuple[list[int], int]:
    """extras §2.3 / §3.4: ``start = max(p - (W - 1) - max(left - (W - 1), 0), 0)``, then
    ``max(start, replay_start)``; ``end = p + right + 1``; the slots of ``start .. end - 1``
    over ``width`` columns, then -1, and the length ``end - start``."""
    left, right = reach
    start = max(p - (w - 1) - max(left - (w - 1), 0), 0)
    start = max(start, replay_start)
    n = p + right + 1 - start
    out = [-1] * width
    for o in range(min(n, width)):
        out[o] = slot(row, start + o, bs)
    return out, n


def gather_len(q: int, length: int, replay_start: int, w: int) -> int:
    """§7.4: ``q + min(max(prefix - replay_start, 0), W - 1)``."""
    return q + min(max(length - q - replay_start, 0), w - 1)


def effective_replay(step: SWAStep, d: int, k: int) -> list[int]:
    """§8.1: a request's replay start if it is prefilling (``d <= b < k``), else 0."""
    return [step.replay_start[b] if d <= b < k else 0 for b in range(len(step.query_lens))]


def plan_ratio(layer_type) -> int:
    """has_compressed (R > 1 in V4's encoding, R > 0 in V4.1's): whether the type reads
    compressed entries at all; the ratio the plan counts by, else 0."""
    return layer_type.compress_ratio if layer_type.reads.value != "none" else 0


def chunk_plan(seq_lens: list[int], query_lens: list[int], ratio: int, w: int,
               max_model_len: int, max_tokens: int, c: int = CHUNK_SIZE) -> list[tuple]:
    """extras §2.5, the greedy plan over the prefill requests, word by word."""
    area = c * ((-(-max_model_len // ratio) if ratio else 0) + w + max_tokens)
    comp = [(length // ratio) if ratio else 0 for length in seq_lens]
    gath = [q + min(max(length - q, 0), w - 1) for q, length in zip(query_lens, seq_lens)]
    plan, s = [], 0
    while s < len(seq_lens):
        n, g, e = comp[s], gath[s], s + 1
        while e < len(seq_lens) and (e - s + 1) * (max(n, comp[e]) + max(g, gath[e])) <= area:
            n, g, e = max(n, comp[e]), max(g, gath[e]), e + 1
        plan.append((s, e, n, n + g))
        s = e
    return plan


def prefill_rows(cfg: ArenaConfig, step: SWAStep, td: int, nt: int, rows: int,
                 replay: list[int]) -> tuple[list[list[int]], list[int]]:
    """extras §2.3: paged prefill rows ``i < rows`` (token ``td + i``); invalid tokens and
    rows past ``nt`` -1 with length 0."""
    _, owner, position = step.tokens()
    w, bs, mit = cfg.sliding_window, cfg.swa_block_size, cfg.max_image_tokens
    out, lens = [], []
    for i in range(rows):
        t = td + i
        if t < nt and step.slots[t] >= 0:
            b = owner[t]
            reach = span_reach(step.image_spans, b, position[t], mit)
            row, n = image_window(step.swa_table[b], position[t], w, bs, replay[b], w + mit,
                                  reach)
        else:
            row, n = [-1] * (w + mit), 0
        out.append(row)
        lens.append(n)
    return out, lens


def decode_rows(cfg: ArenaConfig, step: SWAStep, td: int) -> tuple[list[list[int]], list[int]]:
    """§7.4 for the decode tokens ``t < td`` (decodes never replay); invalid tokens -1 / 0."""
    _, owner, position = step.tokens()
    w, bs = cfg.sliding_window, cfg.swa_block_size
    out = [window(step.swa_table[owner[t]], position[t], w, bs, 0, w)
           if step.slots[t] >= 0 else ([-1] * w, 0) for t in range(td)]
    return [r for r, _ in out], [n for _, n in out]


def plans(cfg: ArenaConfig, seq_lens: list[int], query_lens: list[int],
          chunk_size: int = CHUNK_SIZE) -> dict[str, list[tuple]]:
    """Every windowed type's plan over the given prefill requests."""
    return {t.name: chunk_plan(seq_lens, query_lens, plan_ratio(t), cfg.sliding_window,
                               cfg.max_model_len, cfg.max_num_batched_tokens, chunk_size)
            for t in cfg.layer_types if t.window}


def table(plan: list[tuple], rows: int) -> list[list[int]]:
    """A plan as the device table: its rows, then zeros."""
    return [list(c) for c in plan] + [[0, 0, 0, 0]] * (rows - len(plan))


def expected_eager(cfg: ArenaConfig, step: SWAStep) -> dict:
    """An eager build of ``step`` (every request and token of it, padded ones included)."""
    d = num_decodes(step.query_lens, cfg.decode_threshold)
    k = len(step.query_lens)
    nt = len(step.slots)
    if d == k:  # every request a decode: the decode rows own every token
        return dict(num_prefills=0, replay_start=[0] * k)
    replay = effective_replay(step, d, k)
    td = sum(step.query_lens[:d])
    rows, lens = prefill_rows(cfg, step, td, nt, nt - td, replay)
    gather = [gather_len(step.query_lens[r], step.seq_lens[r], replay[r], cfg.sliding_window)
              for r in range(d, k)]
    return dict(num_prefills=k - d, replay_start=replay, prefill_swa_indices=rows,
                prefill_swa_lens=lens, prefill_gather_lens=gather,
                plans=plans(cfg, step.seq_lens[d:], step.query_lens[d:]))


def expected_mixed(cfg: ArenaConfig, step: SWAStep, num_reqs: int, num_tokens: int) -> dict:
    """A mixed build for a bucket of ``num_reqs`` requests and ``num_tokens`` tokens; the
    step's lists hold the real requests and tokens only."""
    k, nt = len(step.query_lens), len(step.slots)
    d = num_decodes(step.query_lens, cfg.decode_threshold)
    td = sum(step.query_lens[:d])
    replay = effective_replay(step, d, k)
    rows, lens = prefill_rows(cfg, step, td, nt, num_tokens, replay)
    gather = [gather_len(step.query_lens[r], step.seq_lens[r], replay[r], cfg.sliding_window)
              for r in range(d, k)]
    plan = plans(cfg, step.seq_lens[d:], step.query_lens[d:])
    return dict(replay_start=replay + [0] * (num_reqs - k), prefill_swa_indices=rows,
                prefill_swa_lens=lens, prefill_gather_lens=gather + [0] * (num_reqs - k + d),
                tables={n: table(p, cfg.max_num_seqs) for n, p in plan.items()},
                counts={n: len(p) for n, p in plan.items()})


def assert_eager(meta, exp: dict) -> None:
    """The V4.1 / paged-prefill fields of an eager build equal the oracle's."""
    if meta.replay_start is not None:
        same("replay_start", meta.replay_start, exp["replay_start"])
    if exp["num_prefills"] == 0:
        holds(meta.prefill_swa_indices is None and meta.prefill_chunk_plans == {},
              "no prefill rows and no chunk plans without prefills")
        return
    same("prefill_swa_indices[:, 0]", meta.prefill_swa_indices[:, 0],
         exp["prefill_swa_indices"])
    same("prefill_swa_lens", meta.prefill_swa_lens, exp["prefill_swa_lens"])
    same("prefill_gather_lens", meta.prefill_gather_lens, exp["prefill_gather_lens"])
    same("host chunk plans", {n: p.host for n, p in meta.prefill_chunk_plans.items()},
         exp["plans"])
    for name, plan in meta.prefill_chunk_plans.items():
        want = exp["plans"][name]
        same(f"{name} num_chunks", plan.num_chunks, [len(want)])
        same(f"{name} chunks", plan.chunks, table(want, plan.chunks.shape[0]))


def assert_mixed(meta, exp: dict) -> None:
    """The V4.1 / paged-prefill fields of a mixed build equal the oracle's everywhere in the
    bucket's views."""
    if meta.replay_start is not None:
        same("replay_start", meta.replay_start, exp["replay_start"])
    same("prefill_swa_indices[:, 0]", meta.prefill_swa_indices[:, 0],
         exp["prefill_swa_indices"])
    same("prefill_swa_lens", meta.prefill_swa_lens, exp["prefill_swa_lens"])
    same("prefill_gather_lens", meta.prefill_gather_lens, exp["prefill_gather_lens"])
    for name, plan in meta.prefill_chunk_plans.items():
        holds(plan.host is None, f"no host plan of {name} from a graph build")
        same(f"{name} chunks", plan.chunks, exp["tables"][name])
        same(f"{name} num_chunks", plan.num_chunks, [exp["counts"][name]])
