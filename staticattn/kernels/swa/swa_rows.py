"""The sparse sliding-window build, SWA window and dense top-k rows, in one kernel.

One launch over a step of ``num_tokens`` tokens (a static extent) writes, for every token
``t``:

* ``is_valid_token[t] = slot_mapping[t] >= 0``;

for every decode token ``t < Td`` (request ``b``, absolute position ``p``):

* the SWA window (spec §6.6): the ``len = min(p + 1, W)`` most recent positions including
  ``p`` itself, ``pos = p + 1 - len + o`` for ``o < len``, as flat SWA slots
  ``swa_bt[b, pos // bs] * bs + pos % bs``; ``-1`` for ``o >= len``;
* the dense top-k (spec §7): the ``n_c = min((p + 1) // R, maxC)`` complete compressed
  groups (``R = 128``, or the ratio of whichever layer type reads every compressed entry),
  ``o < n_c`` as flat slots ``bt[b, o // cb] * cb + o % cb`` with ``cb = block_size // R``
  entries per main-group block; ``-1`` for ``o >= n_c``;

and for every prefill token ``t`` in ``[Td, nt)`` (``nt`` real tokens), prefill row
``t - Td``, the paged SWA row (``prefill_swa_indices``, ``vllm-0.33-extras.md`` §2.3,
  ``deepseek-v41.md`` §7.4): the decode formula with the bounded-replay clamp,
  ``start = max(p - W + 1, replay_start[b])``, ``len = p - start + 1``, as flat SWA slots
  in a row of the prefill width, -1 after; an invalid token (slot -1): a row of -1 and
  length 0. Inside an image span (``vllm-0.33-extras.md`` §3.4) the window reaches
  ``max(W - 1, left)`` positions behind ``p`` and ``right`` ahead of it.

Defined values everywhere else: a decode token whose slot is -1 (graph padding, or told so by
the engine) and every decode row past ``Td`` gets length 0 and a row of -1; prefill rows past
the real prefill tokens likewise. ``Td`` and ``nt`` are static ints, or read from the
staging's ``step_counts`` on the device (a step of any composition). Example (W = 4, bs = 4):
a token at ``p = 4`` whose request's SWA block row is ``[7, 2]`` gets ``[29, 30, 31, 8]``,
length 4; with ``replay_start = 3`` as a prefill token, ``[31, 8]``, length 2.

The dense prefill rows (local indices, the reference's ``c128a_prefill_topk_indices``) are
written a chunk at a time into a workspace of their own (:mod:`.dense_prefill_rows`), not
here: one row per prefill token of a step would take ``T x maxC`` entries.

Dense rows are up to ``maxC`` wide (8,192 at a 1M context), and the paged prefill rows fill a
bucket's whole capacity, so the Triton kernel writes such a row only up to the longer of its
new length and the length it had before, and keeps the rest of the row as it is: -1. That
invariant (entries at or past a row's length are -1) holds from the arena's fill on, for
every writer of these rows; the cost of a step then follows its actual contexts, not
``max_model_len`` or the bucket. The torch version (:mod:`.swa_rows_torch`) writes whole
rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from staticattn.errors import ArenaError
from staticattn.kernels.runtime.backend import triton_interpreted
from staticattn.kernels.runtime.compiled_launch import grid_size, launch, pow2_at_least
from staticattn.kernels.runtime.deferred import lazy_jit
from staticattn.kernels.staging.step_counts import step_counts_jit
from staticattn.kernels.swa.dense_rows import dense_rows_jit
from staticattn.kernels.swa.swa_rows_torch import build_torch
from staticattn.kernels.swa.window import span_reach_jit, window_rows_jit

__all__ = ["SWADecodeOutputs", "build_swa_decode"]


@dataclass(frozen=True, slots=True)
class SWADecodeOutputs:
    """The arena views :func:`build_swa_decode` writes.

    is_valid_token : bool ``(>= num_tokens,)``
    swa_indices : int32 ``(>= decode rows, 1, W)``, contiguous rows
    swa_lens : int32 ``(>= decode rows,)``
    dense_indices : int32 ``(>= decode rows, 1, maxC)`` or None (no dense layers)
    dense_lens : int32 ``(>= decode rows,)`` or None
    prefill_swa_indices : int32 ``(>= num_tokens, 1, Wp)`` or None, ``Wp >= W`` the prefill
        width (``W``; ``W + max_image_tokens`` for image spans)
    prefill_swa_lens : int32 ``(>= num_tokens,)`` or None
    """

    is_valid_token: torch.Tensor
    swa_indices: torch.Tensor
    swa_lens: torch.Tensor
    dense_indices: torch.Tensor | None = None
    dense_lens: torch.Tensor | None = None
    prefill_swa_indices: torch.Tensor | None = None
    prefill_swa_lens: torch.Tensor | None = None

    def __post_init__(self) -> None:
        # The Triton kernel addresses rows by their width: the views must be contiguous rows.
        for name in ("swa_indices", "dense_indices", "prefill_swa_indices"):
            view = getattr(self, name)
            if view is not None and view.stride(0) != view.shape[-1]:
                raise ArenaError(
                    f"{name} must have contiguous rows of {view.shape[-1]} entries, got row "
                    f"stride {view.stride(0)}; pass the arena view, not a strided slice"
                )

    @property
    def window(self) -> int:
        return self.swa_indices.shape[-1]

    @property
    def dense_width(self) -> int:
        return 0 if self.dense_indices is None else self.dense_indices.shape[-1]

    @property
    def prefill_width(self) -> int:
        return 0 if self.prefill_swa_indices is None else self.prefill_swa_indices.shape[-1]


def build_swa_decode(
    backend: str,
    out: SWADecodeOutputs,
    slot_mapping: torch.Tensor,
    positions: torch.Tensor,
    token_to_req: torch.Tensor,
    swa_block_table: torch.Tensor,
    swa_block_size: int,
    block_table: torch.Tensor | None,
    dense_ratio: int,
    dense_block_entries: int,
    num_tokens: int,
    num_decode_tokens: int,
    block_tokens: int | None = None,
    *,
    decode_rows: int | None = None,
    prefill_rows: bool = False,
    step_counts: torch.Tensor | None = None,
    replay_start: torch.Tensor | None = None,
    image_spans: torch.Tensor | None = None,
    max_image_tokens: int = 0,
) -> None:
    """Write the validity mask of every token, the SWA / dense rows of the decode tokens and,
    with ``prefill_rows``, the paged SWA rows of the prefill tokens.

    Parameters
    ----------
    out : SWADecodeOutputs
        Where to write; without dense outputs only the SWA part runs, without
        ``prefill_swa_indices`` no paged prefill rows.
    slot_mapping : int64 ``(>= num_tokens,)``
        ``-1`` marks an invalid token.
    positions : int64 ``(>= num_tokens,)``
        Absolute position of each token (the staging kernel derives it).
    token_to_req : int32 ``(>= num_tokens,)``
        Request of each token (the staging kernel derives it; padded tokens 0).
    swa_block_table : int32 ``(num_reqs, cols)``
        SWA group, ``swa_block_size`` tokens per block.
    block_table : int32 ``(num_reqs, cols)`` or None
        Main group, read by the dense part (``dense_block_entries`` entries per block).
    dense_ratio : int
        ``R`` of the dense part: tokens per compressed entry (128 for C128A).
    num_tokens : int
        Static extent: tokens of the step, padding included.
    num_decode_tokens : int
        The leading decode tokens: ``Td`` when ``step_counts`` is None, else ignored.
    block_tokens : int, optional
        Tokens per Triton program; default 2 compiled (many small programs keep every SM
        busy), 64 interpreted (the CPU interpreter pays per program).
    decode_rows : int, optional
        Decode rows written (``Td`` itself, or with ``step_counts`` the capacity that rows
        past the real ``Td`` are cleared up to). Default ``num_decode_tokens``.
    prefill_rows : bool
        Also write prefill rows ``[0, num_tokens)`` (the step has prefills); rows of the real
        prefill tokens hold their indices, the others are cleared.
    step_counts : int32 device ``(4,)`` or None
        The staging's ``[k, nt, D, Td]``: read ``Td`` and ``nt`` there (any composition).
    replay_start : int32 ``(num_reqs,)`` or None
        Bounded replay: each request's first replayed position, clamping its prefill
        windows (decodes carry 0, ``docs/spec/deepseek-v41.md`` §8.1). None: no clamp.
    image_spans : int32 ``(S, 3)`` or None
        Image spans (rows ``(request, first, last)``, unused rows request -1) that widen the
        paged prefill rows of the tokens inside them to ``[p - max(W - 1, left), p + right]``
        (``vllm-0.33-extras.md`` §3.4), ``max_image_tokens`` bounding ``left`` and
        ``right``. None: plain windows.
    """
    if num_tokens == 0:
        return
    decode_rows = num_decode_tokens if decode_rows is None else decode_rows
    swa_prefill = prefill_rows and out.prefill_swa_indices is not None
    args = (out, slot_mapping, positions, token_to_req, swa_block_table, swa_block_size,
            block_table, dense_ratio, dense_block_entries, num_tokens, num_decode_tokens,
            decode_rows, swa_prefill, step_counts, replay_start,
            image_spans if swa_prefill else None, max_image_tokens)
    if backend == "triton":
        _build_triton(*args, block_tokens)
    else:
        build_torch(*args)


@lazy_jit(step_counts_jit, window_rows_jit, span_reach_jit, dense_rows_jit)
def _swa_decode_kernel(triton, tl, live_count, SLOT_TOKENS, SLOT_DECODE_TOKENS, window_rows,
                       span_reach, dense_rows, **_):
    @triton.jit(do_not_specialize=["num_tokens", "num_decode_tokens", "decode_rows"])
    def swa_decode_kernel(
        slot_mapping, positions, token_to_req,
        swa_block_table, swa_bt_stride, block_table, bt_stride,
        is_valid_out, swa_indices_out, swa_lens_out, dense_indices_out, dense_lens_out,
        prefill_swa_out, prefill_swa_lens_out,
        replay_start, spans, counts, num_tokens, num_decode_tokens, decode_rows,
        WINDOW: tl.constexpr, SWA_BLOCK: tl.constexpr, HAS_DENSE: tl.constexpr,
        SWA_PREFILL: tl.constexpr, HAS_REPLAY: tl.constexpr,
        DEVICE_COUNTS: tl.constexpr, PREFILL_WIDTH: tl.constexpr,
        DENSE_WIDTH: tl.constexpr, DENSE_ENTRIES: tl.constexpr, DENSE_RATIO: tl.constexpr,
        MIT: tl.constexpr, NUM_SPANS: tl.constexpr, BLOCK_S: tl.constexpr,
        BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr,
    ):
        # Index i of this program: token i (validity, decode row i) and prefill row i.
        i = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        in_step = i < num_tokens
        slot = tl.load(slot_mapping + i, mask=in_step, other=-1)
        valid = slot >= 0
        tl.store(is_valid_out + i, valid, mask=in_step)
        td = live_count(counts, SLOT_DECODE_TOKENS, num_decode_tokens, DEVICE_COUNTS)
        nt = live_count(counts, SLOT_TOKENS, num_tokens, DEVICE_COUNTS)
        is_row = i < decode_rows
        if tl.program_id(0) * BLOCK_T < decode_rows:
            live = is_row & (i < td) & valid
            req = tl.load(token_to_req + i, mask=live, other=0).to(tl.int64)
            pos = tl.load(positions + i, mask=live, other=0).to(tl.int32)
            # Decodes never replay (docs/spec/deepseek-v41.md §8.1): no clamp here.
            start = tl.maximum(pos - WINDOW + 1, 0)
            window_rows(swa_indices_out, WINDOW, swa_lens_out, i, is_row, live, req, start,
                        tl.maximum(pos - start + 1, 0), swa_block_table, swa_bt_stride,
                        WINDOW, SWA_BLOCK, BLOCK_W, True, False)
            if HAS_DENSE:
                n_c = tl.minimum(tl.maximum(pos + 1, 0) // DENSE_RATIO, DENSE_WIDTH)
                dense_rows(dense_indices_out, dense_lens_out, i, is_row,
                           tl.where(live, n_c, 0), block_table, bt_stride, req,
                           False, DENSE_WIDTH, DENSE_ENTRIES, BLOCK_C)
        if SWA_PREFILL:
            # Prefill row i holds token td + i; rows past the real prefill tokens are cleared.
            t = td + i
            live_p = in_step & (t < nt)
            pos_p = tl.load(positions + t, mask=live_p, other=0).to(tl.int32)
            # Invalid tokens: a row of -1, length 0 (vllm-0.33-extras.md §2.3).
            live_s = live_p & (tl.load(slot_mapping + t, mask=live_p, other=-1) >= 0)
            req_p = tl.load(token_to_req + t, mask=live_s, other=0).to(tl.int64)
            behind = tl.zeros_like(pos_p) + (WINDOW - 1)
            ahead = tl.zeros_like(pos_p)
            if NUM_SPANS > 0:  # image spans widen the window (vllm-0.33-extras.md §3.4)
                left, ahead = span_reach(spans, req_p, pos_p, live_s, MIT, NUM_SPANS,
                                         BLOCK_S)
                behind = tl.maximum(behind, left)
            start_p = tl.maximum(pos_p - behind, 0)
            if HAS_REPLAY:
                start_p = tl.maximum(start_p, tl.load(replay_start + req_p, mask=live_s,
                                                      other=0))
            window_rows(prefill_swa_out, PREFILL_WIDTH, prefill_swa_lens_out, i, in_step,
                        live_s, req_p, start_p, tl.maximum(pos_p + ahead - start_p + 1, 0),
                        swa_block_table, swa_bt_stride, PREFILL_WIDTH, SWA_BLOCK, BLOCK_W,
                        True, True)

    return swa_decode_kernel


def _build_triton(out, slot_mapping, positions, token_to_req, swa_block_table, swa_block_size,
                  block_table, dense_ratio, dense_block_entries, num_tokens, num_decode_tokens,
                  decode_rows, swa_prefill, step_counts, replay_start, image_spans,
                  max_image_tokens, block_tokens) -> None:
    has_dense = out.dense_indices is not None
    if block_tokens is None:
        block_tokens = 64 if triton_interpreted() else 2
    dense_width = out.dense_width
    # Unused pointer arguments (no dense layers, no prefill rows, static counts, no replay)
    # point at views of the right dtype; never dereferenced.
    bt = block_table if has_dense else swa_block_table
    i32 = out.swa_lens
    block_c = min(pow2_at_least(dense_width, 16), 1024)
    grid = (grid_size(max(num_tokens, decode_rows), block_tokens),)
    launch(_swa_decode_kernel(), grid,
        slot_mapping, positions, token_to_req,
        swa_block_table, swa_block_table.stride(0), bt, bt.stride(0),
        out.is_valid_token, out.swa_indices, out.swa_lens,
        out.dense_indices if has_dense else out.swa_indices,
        out.dense_lens if has_dense else i32,
        out.prefill_swa_indices if swa_prefill else out.swa_indices,
        out.prefill_swa_lens if swa_prefill else i32,
        i32 if replay_start is None else replay_start,
        i32 if image_spans is None else image_spans,
        i32 if step_counts is None else step_counts,
        num_tokens, num_decode_tokens, decode_rows,
        WINDOW=out.window, SWA_BLOCK=swa_block_size, HAS_DENSE=has_dense,
        SWA_PREFILL=swa_prefill,
        HAS_REPLAY=replay_start is not None, DEVICE_COUNTS=step_counts is not None,
        PREFILL_WIDTH=max(out.prefill_width, 1),
        DENSE_WIDTH=max(dense_width, 1), DENSE_ENTRIES=max(dense_block_entries, 1),
        DENSE_RATIO=dense_ratio, MIT=max(max_image_tokens, 1),
        NUM_SPANS=0 if image_spans is None else image_spans.shape[0],
        BLOCK_S=pow2_at_least(1 if image_spans is None else image_spans.shape[0], 16),
        BLOCK_T=block_tokens,
        BLOCK_W=pow2_at_least(max(out.window, out.prefill_width), 16),
        BLOCK_C=block_c,
    )
