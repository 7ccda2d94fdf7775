"""The plain-torch twin of the sparse sliding-window kernel (:mod:`.swa_rows`): the same
outputs with tensor ops, for CPUs and as a second opinion. Graph-safe: no read back, no
branch on values; it allocates temporaries (see :mod:`staticattn.kernels.runtime.backend`)."""

from __future__ import annotations

import torch

from staticattn.kernels.staging.stage_inputs import COUNT_DECODE_TOKENS, COUNT_TOKENS

__all__ = ["build_torch", "complete_groups", "gather_slots", "span_reach", "window_start"]


def build_torch(out, slot_mapping, positions, token_to_req, swa_block_table, swa_block_size,
                block_table, dense_ratio, dense_block_entries, num_tokens, num_decode_tokens,
                decode_rows, swa_prefill, step_counts, replay_start,
                image_spans=None, max_image_tokens=0) -> None:
    """:func:`~staticattn.kernels.swa.swa_rows.build_swa_decode` with tensor ops."""
    dev = slot_mapping.device
    valid = slot_mapping[:num_tokens] >= 0
    out.is_valid_token[:num_tokens].copy_(valid)
    if step_counts is None:
        td = torch.full((), num_decode_tokens, device=dev)
        nt = torch.full((), num_tokens, device=dev)
    else:
        td, nt = step_counts[COUNT_DECODE_TOKENS], step_counts[COUNT_TOKENS]
    rows = decode_rows
    if rows > 0:
        t = torch.arange(rows, device=dev)
        # int32 throughout (the outputs are int32): half the temporaries of int64.
        live = ((t < td) & valid[:rows])[:, None]
        req = token_to_req[:rows, None]
        pos = positions[:rows, None].int()
        # Decodes never replay (docs/spec/deepseek-v41.md §8.1): no replay clamp here.
        first, window_len = window_start(pos, out.window, None)
        out.swa_lens[:rows].copy_(torch.where(live, window_len, 0)[:, 0])
        out.swa_indices[:rows, 0].copy_(gather_slots(
            swa_block_table, req, first, window_len, live, out.window, swa_block_size))
        if out.dense_indices is not None:
            n_c = complete_groups(pos, dense_ratio, out.dense_width)
            out.dense_lens[:rows].copy_(torch.where(live, n_c, 0)[:, 0])
            out.dense_indices[:rows, 0].copy_(gather_slots(
                block_table, req, torch.zeros_like(n_c), n_c, live, out.dense_width,
                dense_block_entries))
    if not swa_prefill:
        return
    # Prefill row r holds token td + r; rows past the real prefill tokens are cleared.
    r = torch.arange(num_tokens, device=dev)
    t = (td + r).clamp(max=max(num_tokens - 1, 0))
    pos = positions[t, None].int()
    # Invalid tokens (slot -1): a row of -1 and length 0 (vllm-0.33-extras.md §2.3).
    live = (td + r < nt)[:, None] & valid[t, None]
    req = token_to_req[t, None]
    rs = None if replay_start is None else replay_start[req]
    reach = None if image_spans is None else span_reach(image_spans, req, pos,
                                                         max_image_tokens)
    first, n = window_start(pos, out.window, rs, reach)
    width = out.prefill_swa_indices.shape[-1]
    out.prefill_swa_lens[:num_tokens].copy_(torch.where(live, n, 0)[:, 0])
    out.prefill_swa_indices[:num_tokens, 0].copy_(gather_slots(
        swa_block_table, req, first, n, live, width, swa_block_size))


def window_start(pos: torch.Tensor, window: int, replay_start: torch.Tensor | None,
                 reach: tuple[torch.Tensor, torch.Tensor] | None = None,
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(start, len)`` of the window of a token at ``pos``: ``start = max(p - W + 1,
    replay_start, 0)``, ``len = max(p - start + 1, 0)`` (``docs/spec/deepseek-v41.md``
    §7.4); without ``replay_start`` the last ``min(p + 1, W)`` positions. With an image
    span's ``reach = (left, right)`` (:func:`span_reach`, ``vllm-0.33-extras.md`` §3.4):
    ``start = max(p - max(W - 1, left), 0)`` before the replay clamp and the window ends at
    ``p + right``. Int tensors of any shape (broadcast), the result in their dtype and
    shape."""
    behind, ahead = (window - 1, 0) if reach is None else (
        torch.clamp(reach[0], min=window - 1), reach[1])
    start = (pos - behind).clamp(min=0)
    if replay_start is not None:
        start = torch.maximum(start, replay_start)
    return start, (pos + ahead - start + 1).clamp(min=0)


def span_reach(spans: torch.Tensor, req: torch.Tensor, pos: torch.Tensor,
               mit: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(left, right)`` of tokens ``(req, pos)`` (int ``(rows, 1)``) in the image spans
    ``spans`` (int32 ``(S, 3)`` rows ``(request, first, last)``, unused rows request -1):
    ``min(pos - first, mit - 1)`` and ``min(last - pos, mit)`` of the span holding the
    token, 0 outside every span (``vllm-0.33-extras.md`` §3.3); int32 ``(rows, 1)``."""
    owner, first, last = spans[:, 0], spans[:, 1], spans[:, 2]
    inside = (owner == req) & (first <= pos) & (pos <= last)
    zero = torch.zeros((), dtype=torch.int32, device=spans.device)
    left = torch.where(inside, torch.clamp(pos - first, max=mit - 1), zero).amax(1, True)
    right = torch.where(inside, torch.clamp(last - pos, max=mit), zero).amax(1, True)
    return left.int(), right.int()


def complete_groups(pos: torch.Tensor, ratio: int, width: int) -> torch.Tensor:
    """``n_c = min((p + 1) // R, maxC)`` of positions ``pos`` (int, any shape), 0 before
    the first group; in ``pos``'s dtype and shape."""
    return torch.clamp((pos + 1).clamp(min=0) // ratio, max=width)


def gather_slots(table, req, first, count, live, width, entries_per_block) -> torch.Tensor:
    """Rows of ``width``: flat slots of entries ``first .. first + count - 1`` of each row's
    request through ``table`` (int32 ``(num_reqs, cols)``), -1 past ``count`` or for dead
    rows; ``req``, ``first``, ``count``, ``live`` int / bool ``(rows, 1)``, the result int32
    ``(rows, width)``. Masked entries index entry 0 of the request so every gather stays in
    range (all operands non-negative)."""
    o = torch.arange(width, device=table.device, dtype=torch.int32)
    keep = live & (o < count)
    entry = torch.where(keep, first + o, 0)
    blocks = table[req, entry // entries_per_block]
    slots = blocks * entries_per_block + entry % entries_per_block
    return torch.where(keep, slots, -1)
