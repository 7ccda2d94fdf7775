"""Oracle of the decoder-side replay sub-batch (``docs/spec/deepseek-v41.md`` §8.2) and of
the DSpark draft step's SWA rows (§7.5), in plain loops from the spec's words.

Fixed-capacity layout (staticattn's): sub-batch rows, positions and requests 0 past the
sub-batch's tokens, slots -1, padded requests' kept length and ``kv_start`` 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from staticattn.reference.v41_swa import SWAStep, effective_replay, num_decodes, slot

if TYPE_CHECKING:
    from staticattn.arena import ArenaConfig

__all__ = ["draft_rows", "sub_batch"]


def sub_batch(cfg: ArenaConfig, step: SWAStep, num_reqs: int, num_tokens: int) -> dict:
    """§8.2 for ``step`` (its real requests) at extents ``num_reqs`` / ``num_tokens``: each
    request keeps its last ``min(q, W)`` rows, decodes all theirs."""
    w = cfg.sliding_window
    qsl, _, position = step.tokens()
    k = len(step.query_lens)
    d = num_decodes(step.query_lens, cfg.decode_threshold)
    replay = effective_replay(step, d, k)
    kept, kv_start, rows, sub_qsl = [], [], [], [0]
    for b in range(k):
        q, length = step.query_lens[b], step.seq_lens[b]
        keep = q if b < d else min(q, w)
        kept.append(keep)
        trimmed = keep < q
        kv_start.append(max(replay[b], length - w) if trimmed else replay[b])
        rows += range(qsl[b] + q - keep, qsl[b] + q)
        sub_qsl.append(sub_qsl[-1] + keep)
    total = len(rows)
    owner = [b for b in range(k) for _ in range(kept[b])]
    pad_t = num_tokens - total
    slots = [step.slots[r] for r in rows]
    return dict(
        query_start_loc=sub_qsl + [total] * (num_reqs - k),
        query_lens=kept + [0] * (num_reqs - k),
        kv_start=kv_start + [0] * (num_reqs - k),
        rows=rows + [0] * pad_t,
        token_to_req=owner + [0] * pad_t,
        positions=[position[r] for r in rows] + [0] * pad_t,
        slot_mapping=slots + [-1] * pad_t,
        step_counts=[k, total, d, sum(kept[:d])],
        step=SWAStep(kept, list(step.seq_lens), kv_start, slots, step.swa_table),
        first_layer_step=SWAStep(kept, list(step.seq_lens), replay, slots, step.swa_table),
    )


def draft_rows(cfg: ArenaConfig, step: SWAStep, width: int, num_tokens: int) -> dict:
    """§7.5: every token of request ``b`` gets the non-causal window ``[max(prefix - W, 0),
    L)``, ``prefix = L - q``, as flat SWA slots in a row of ``width``, then -1; invalid
    tokens (slot -1) and tokens past the step -1 with length 0."""
    w, bs = cfg.sliding_window, cfg.swa_block_size
    _, owner, _ = step.tokens()
    valid = [t < len(owner) and step.slots[t] >= 0 for t in range(num_tokens)]
    rows, lens = [[-1] * width for _ in range(num_tokens)], [0] * num_tokens
    for t in range(num_tokens):
        if valid[t]:
            b = owner[t]
            length = step.seq_lens[b]
            start = max(length - step.query_lens[b] - w, 0)
            lens[t] = length - start
            for o in range(lens[t]):
                rows[t][o] = slot(step.swa_table[b], start + o, bs)
    return dict(rows=rows, lens=lens, is_valid_token=valid,
                token_to_req=[owner[t] if t < len(owner) else 0 for t in range(num_tokens)])
