"""Oracle of the per-layer index rows, in plain loops, from the spec's words only:
prefill combined rows in workspace coordinates (``docs/spec/deepseek-v41.md`` §7.2,
``vllm-0.33-extras.md`` §5.1, image spans included) and FlashInfer rows in paged coordinates
(§7.3, extras §5.3).

Definitions of staticattn's where the spec is silent: a -1 top-k entry stays -1 (V4.1's
rule; V4's kernel would shift it); FlashInfer rows of invalid tokens are -1 with length
``W`` (the decode rule, applied to prefill tokens too); rows past the real step -1 / 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from staticattn.reference.v41_swa import (
    SWAStep,
    chunk_plan,
    effective_replay,
    gather_len,
    num_decodes,
    plan_ratio,
    slot,
    span_reach,
    window,
)

if TYPE_CHECKING:
    from staticattn.arena import ArenaConfig

__all__ = ["combined", "flashinfer", "n_c"]


def n_c(p: int, ratio: int) -> int:
    """§1: ``floor((p + 1) / R)``; nothing for ``R = 0``."""
    return (p + 1) // ratio if ratio else 0


def combined(cfg: ArenaConfig, step: SWAStep, layer_type, topk: list[list[int]], k: int,
             rows: int, real_reqs: int | None = None) -> tuple[list[list[int]], list[int]]:
    """§7.2 rows ``i < rows`` (prefill token ``Td + i``), width ``round_up(K + W + mit,
    128)``; a token in an image span sees ``[max(p - max(W - 1, left), 0), p + right]``;
    ``topk[t]`` is token ``t``'s top-k row (None: ``k = c``). ``real_reqs``: the requests
    the plan covers (a bucket's real ones), default all. Tokens of no request (graph
    padding) are -1 / 0."""
    w, mit = cfg.sliding_window, cfg.max_image_tokens
    width = -(-(k + w + mit) // 128) * 128
    _, owner, position = step.tokens()
    nreq = len(step.query_lens) if real_reqs is None else real_reqs
    d = num_decodes(step.query_lens, cfg.decode_threshold)
    td, nt = sum(step.query_lens[:d]), sum(step.query_lens[:nreq])
    replay = effective_replay(step, d, nreq)
    ratio = plan_ratio(layer_type)
    plan = chunk_plan(step.seq_lens[d:nreq], step.query_lens[d:nreq], ratio, w,
                      cfg.max_model_len, cfg.max_num_batched_tokens)
    out, lens = [[-1] * width for _ in range(rows)], [0] * rows
    for i in range(min(rows, nt - td)):
        t, row = td + i, out[i]
        b, p = owner[t], position[t]
        j = b - d
        s, _, n, m = next(c for c in plan if c[0] <= j < c[1])
        i_c = j - s
        g = gather_len(step.query_lens[b], step.seq_lens[b], replay[b], w)
        gather_start = step.seq_lens[b] - g
        topk_len = max(min(n_c(p, ratio), k), 0)
        for col in range(topk_len):
            entry = col if topk is None else topk[t][col]
            row[col] = entry + m * i_c if 0 <= entry < n else -1
        left, right = span_reach(step.image_spans, b, p, mit)
        swa_start = max(p - max(w - 1, left), 0, gather_start)
        swa_len = p + right - swa_start + 1
        for o in range(swa_len):
            row[topk_len + o] = m * i_c + n + (swa_start - gather_start) + o
        lens[i] = topk_len + swa_len
    return out, lens


def flashinfer(cfg: ArenaConfig, step: SWAStep, layer_type, topk: list[list[int]] | None,
               compressed_table: list[list[int]] | None, k: int, rows: int,
               real_reqs: int | None = None) -> tuple[list[list[int]], list[int]]:
    """§7.3 rows ``t < rows``, width ``W + round_up(K, 4)``. Every token of the step's
    extent is a row (graph padding too: slot -1, length ``W``, as the reference's case 2);
    rows past it -1 / 0."""
    w, bs = cfg.sliding_window, cfg.swa_block_size
    s_page = cfg.block_size // max(layer_type.compress_ratio, 1)
    width = w + -(-k // 4) * 4
    _, owner, position = step.tokens()
    nreq = len(step.query_lens) if real_reqs is None else real_reqs
    d = num_decodes(step.query_lens, cfg.decode_threshold)
    td, nt = sum(step.query_lens[:d]), len(step.slots)
    replay = effective_replay(step, d, nreq)
    out, lens = [[-1] * width for _ in range(rows)], [0] * rows
    for t in range(min(rows, nt)):
        row = out[t]
        if step.slots[t] < 0:
            lens[t] = w
            continue
        b, p = owner[t], position[t]
        swa, _ = window(step.swa_table[b], p, w, bs, replay[b] if t >= td else 0, w)
        row[:w] = swa
        extra = 0
        take = k if t < td else min(n_c(p, layer_type.compress_ratio), k)
        for c in range(take):
            entry = topk[t][c]
            if entry >= 0:
                row[w + c] = slot(compressed_table[b], entry, s_page)
                extra += 1
        lens[t] = w + (extra if t < td else take)
    return out, lens
