"""The sparse sliding-window build, SWA window and C128A top-k rows, in one kernel.

One launch over a step of ``num_tokens`` tokens (a static extent) writes, for every token
``t``:

* ``is_valid_token[t] = slot_mapping[t] >= 0``;

for every decode token ``t < Td`` (request ``b``, absolute position ``p``):

* the SWA window (spec §6.6): the ``len = min(p + 1, W)`` most recent positions including
  ``p`` itself, ``pos = p + 1 - len + o`` for ``o < len``, as flat SWA slots
  ``swa_bt[b, pos // bs] * bs + pos % bs``; ``-1`` for ``o >= len``;
* the C128A top-k (spec §7): the ``n_c = min((p + 1) // R, maxC)`` complete compressed
  groups (``R = 128``, or the ratio of whichever layer type reads every compressed entry),
  ``o < n_c`` as flat slots ``bt[b, o // cb] * cb + o % cb`` with ``cb = block_size // R``
  entries per main-group block; ``-1`` for ``o >= n_c``;

and for every prefill token ``t`` in ``[Td, nt)`` (``nt`` real tokens), C128A prefill row
``t - Td``: the local indices ``o`` for ``o < n_c``, -1 after (the reference's
``c128a_prefill_topk_indices``), with its length ``n_c`` in ``c128a_prefill_lens``.

Defined values everywhere else: a decode token whose slot is -1 (graph padding, or told so by
the engine) and every decode row past ``Td`` gets length 0 and a row of -1; prefill rows past
the real prefill tokens likewise. ``Td`` and ``nt`` are static ints, or read from the
staging's ``step_counts`` on the device (a step of any composition). Example (W = 4, bs = 4):
a token at ``p = 4`` whose request's SWA block row is ``[7, 2]`` gets ``[29, 30, 31, 8]``,
length 4.

C128A rows are up to ``maxC`` wide (8,192 at a 1M context), so the Triton kernel writes a row
only up to the longer of its new length and the length it had before, and keeps the rest of
the row as it is: -1. That invariant (entries at or past a row's length are -1) holds from the
arena's fill on, for every writer of these rows; the cost of a step then follows its actual
contexts, not ``max_model_len``. The torch version writes whole rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from staticattn.errors import ArenaError
from staticattn.kernels.backend import triton_interpreted
from staticattn.kernels.launch import grid_size, launch, pow2_at_least
from staticattn.kernels.lazy import lazy_jit, publish
from staticattn.kernels.staging import COUNT_DECODE_TOKENS, COUNT_TOKENS

__all__ = ["SWADecodeOutputs", "build_swa_decode"]


@dataclass(frozen=True, slots=True)
class SWADecodeOutputs:
    """The arena views :func:`build_swa_decode` writes.

    is_valid_token : bool ``(>= num_tokens,)``
    swa_indices : int32 ``(>= decode rows, 1, W)``, contiguous rows
    swa_lens : int32 ``(>= decode rows,)``
    c128a_indices : int32 ``(>= decode rows, 1, maxC)`` or None (no C128A layers)
    c128a_lens : int32 ``(>= decode rows,)`` or None
    c128a_prefill_indices : int32 ``(>= num_tokens, maxC)`` or None
    c128a_prefill_lens : int32 ``(>= num_tokens,)`` or None
    """

    is_valid_token: torch.Tensor
    swa_indices: torch.Tensor
    swa_lens: torch.Tensor
    c128a_indices: torch.Tensor | None = None
    c128a_lens: torch.Tensor | None = None
    c128a_prefill_indices: torch.Tensor | None = None
    c128a_prefill_lens: torch.Tensor | None = None

    def __post_init__(self) -> None:
        # The Triton kernel addresses rows by their width: the views must be contiguous rows.
        for name in ("swa_indices", "c128a_indices", "c128a_prefill_indices"):
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
    def c128a_width(self) -> int:
        return 0 if self.c128a_indices is None else self.c128a_indices.shape[-1]


def build_swa_decode(
    backend: str,
    out: SWADecodeOutputs,
    slot_mapping: torch.Tensor,
    positions: torch.Tensor,
    token_to_req: torch.Tensor,
    swa_block_table: torch.Tensor,
    swa_block_size: int,
    block_table: torch.Tensor | None,
    c128a_ratio: int,
    c128a_block_entries: int,
    num_tokens: int,
    num_decode_tokens: int,
    block_tokens: int | None = None,
    *,
    decode_rows: int | None = None,
    prefill_rows: bool = False,
    step_counts: torch.Tensor | None = None,
) -> None:
    """Write the validity mask of every token, the SWA / C128A rows of the decode tokens and,
    with ``prefill_rows``, the C128A rows of the prefill tokens.

    Parameters
    ----------
    backend : {"torch", "triton"}
    out : SWADecodeOutputs
        Where to write; without C128A outputs only the SWA part runs.
    slot_mapping : int64 ``(>= num_tokens,)``
        ``-1`` marks an invalid token.
    positions : int64 ``(>= num_tokens,)``
        Absolute position of each token (the staging kernel derives it).
    token_to_req : int32 ``(>= num_tokens,)``
        Request of each token (the staging kernel derives it; padded tokens 0).
    swa_block_table : int32 ``(num_reqs, cols)``
        SWA group, ``swa_block_size`` tokens per block.
    block_table : int32 ``(num_reqs, cols)`` or None
        Main group, read by the C128A part (``c128a_block_entries`` entries per block).
    c128a_ratio : int
        ``R`` of the C128A part: tokens per compressed entry (128 for C128A).
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
        Also write C128A prefill rows ``[0, num_tokens - Td)`` (the step has prefills); rows
        of the real prefill tokens hold their indices, the others are cleared.
    step_counts : int32 device ``(4,)`` or None
        The staging's ``[k, nt, D, Td]``: read ``Td`` and ``nt`` there (any composition).
    """
    if num_tokens == 0:
        return
    decode_rows = num_decode_tokens if decode_rows is None else decode_rows
    prefill_rows = prefill_rows and out.c128a_prefill_indices is not None
    args = (out, slot_mapping, positions, token_to_req, swa_block_table, swa_block_size,
            block_table, c128a_ratio, c128a_block_entries, num_tokens, num_decode_tokens,
            decode_rows, prefill_rows, step_counts)
    if backend == "triton":
        _build_triton(*args, block_tokens)
    else:
        _build_torch(*args)


def _build_torch(out, slot_mapping, positions, token_to_req, swa_block_table, swa_block_size,
                 block_table, c128a_ratio, c128a_block_entries, num_tokens, num_decode_tokens,
                 decode_rows, prefill_rows, step_counts) -> None:
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
        window_len = torch.clamp(pos + 1, min=0, max=out.window)
        out.swa_lens[:rows].copy_(torch.where(live, window_len, 0)[:, 0])
        out.swa_indices[:rows, 0].copy_(_gather_slots(
            swa_block_table, req, pos + 1 - window_len, window_len, live, out.window,
            swa_block_size))
        if out.c128a_indices is not None:
            n_c = _complete_groups(pos, c128a_ratio, out.c128a_width)
            out.c128a_lens[:rows].copy_(torch.where(live, n_c, 0)[:, 0])
            out.c128a_indices[:rows, 0].copy_(_gather_slots(
                block_table, req, torch.zeros_like(n_c), n_c, live, out.c128a_width,
                c128a_block_entries))
    if prefill_rows:
        r = torch.arange(num_tokens, device=dev)
        t = (td + r).clamp(max=max(num_tokens - 1, 0))
        live = (td + r < nt)[:, None]
        n_c = _complete_groups(positions[t, None].int(), c128a_ratio, out.c128a_width)
        o = torch.arange(out.c128a_width, device=dev, dtype=torch.int32)
        out.c128a_prefill_lens[:num_tokens].copy_(torch.where(live, n_c, 0)[:, 0])
        out.c128a_prefill_indices[:num_tokens].copy_(torch.where(live & (o < n_c), o, -1))


def _complete_groups(pos: torch.Tensor, ratio: int, width: int) -> torch.Tensor:
    """``n_c = min((p + 1) // R, maxC)``, 0 for positions before the first group."""
    return torch.clamp((pos + 1).clamp(min=0) // ratio, max=width)


def _gather_slots(table, req, first, count, live, width, entries_per_block) -> torch.Tensor:
    """Rows of ``width``: flat slots of entries ``first .. first + count - 1`` of each row's
    request through ``table``, -1 past ``count`` or for dead rows. Masked entries index
    entry 0 of the request so every gather stays in range (all operands non-negative)."""
    o = torch.arange(width, device=table.device, dtype=torch.int32)
    keep = live & (o < count)
    entry = torch.where(keep, first + o, 0)
    blocks = table[req, entry // entries_per_block]
    slots = blocks * entries_per_block + entry % entries_per_block
    return torch.where(keep, slots, -1)


@lazy_jit
def _swa_decode_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def c128a_rows(indices, lens, rows, live_mask, n_new, block_table, bt_stride, req,
                   LOCAL: tl.constexpr, WIDTH: tl.constexpr, ENTRIES: tl.constexpr,
                   BLOCK_C: tl.constexpr):
        """Write rows ``rows`` (masked by ``live_mask``) to ``n_new`` entries: global slots
        through the block table, or local indices (``LOCAL``); clear up to the old length."""
        n_old = tl.load(lens + rows, mask=live_mask, other=0)
        reach = tl.max(tl.where(live_mask, tl.maximum(n_new, n_old), 0), axis=0)
        for c0 in range(0, reach, BLOCK_C):
            e = c0 + tl.arange(0, BLOCK_C)
            keep = e[None, :] < n_new[:, None]
            if LOCAL:
                value = tl.where(keep, e[None, :], -1)
            else:
                blk = tl.load(block_table + req[:, None] * bt_stride + e[None, :] // ENTRIES,
                              mask=keep, other=0)
                value = tl.where(keep, blk * ENTRIES + e[None, :] % ENTRIES, -1)
            reach_row = tl.maximum(n_new, n_old)
            tl.store(indices + rows.to(tl.int64)[:, None] * WIDTH + e[None, :], value,
                     mask=live_mask[:, None] & (e[None, :] < reach_row[:, None]))
        tl.store(lens + rows, n_new, mask=live_mask)

    publish(globals(), c128a_rows)

    @triton.jit(do_not_specialize=["num_tokens", "num_decode_tokens", "decode_rows"])
    def swa_decode_kernel(
        slot_mapping, positions, token_to_req,
        swa_block_table, swa_bt_stride, block_table, bt_stride,
        is_valid_out, swa_indices_out, swa_lens_out, c128a_indices_out, c128a_lens_out,
        c128a_prefill_out, c128a_prefill_lens_out, counts,
        num_tokens, num_decode_tokens, decode_rows,
        WINDOW: tl.constexpr, SWA_BLOCK: tl.constexpr, HAS_C128A: tl.constexpr,
        PREFILL_ROWS: tl.constexpr, DEVICE_COUNTS: tl.constexpr,
        C128A_WIDTH: tl.constexpr, C128A_ENTRIES: tl.constexpr, C128A_RATIO: tl.constexpr,
        BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr,
    ):
        # Index i of this program: token i (validity, decode row i) and prefill row i.
        i = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        in_step = i < num_tokens
        slot = tl.load(slot_mapping + i, mask=in_step, other=-1)
        valid = slot >= 0
        tl.store(is_valid_out + i, valid, mask=in_step)
        if DEVICE_COUNTS:
            td = tl.load(counts + 3)
            nt = tl.load(counts + 1)
        else:
            td = num_decode_tokens
            nt = num_tokens
        is_row = i < decode_rows
        if tl.program_id(0) * BLOCK_T < decode_rows:
            live = is_row & (i < td) & valid
            req = tl.load(token_to_req + i, mask=live, other=0).to(tl.int64)
            pos = tl.load(positions + i, mask=live, other=0).to(tl.int32)
            window_len = tl.where(live, tl.maximum(tl.minimum(pos + 1, WINDOW), 0), 0)
            tl.store(swa_lens_out + i, window_len, mask=is_row)
            o = tl.arange(0, BLOCK_W)
            keep = o[None, :] < window_len[:, None]
            # Masked entries are 0, so // and % (truncating in Triton) see no negatives.
            p = tl.where(keep, (pos + 1 - window_len)[:, None] + o[None, :], 0)
            blk = tl.load(swa_block_table + req[:, None] * swa_bt_stride + p // SWA_BLOCK,
                          mask=keep, other=0)
            tl.store(swa_indices_out + i.to(tl.int64)[:, None] * WINDOW + o[None, :],
                     tl.where(keep, blk * SWA_BLOCK + p % SWA_BLOCK, -1),
                     mask=is_row[:, None] & (o[None, :] < WINDOW))
            if HAS_C128A:
                n_c = tl.minimum(tl.maximum(pos + 1, 0) // C128A_RATIO, C128A_WIDTH)
                c128a_rows(c128a_indices_out, c128a_lens_out, i, is_row,
                           tl.where(live, n_c, 0), block_table, bt_stride, req,
                           False, C128A_WIDTH, C128A_ENTRIES, BLOCK_C)
        if PREFILL_ROWS:
            # Prefill row i holds token td + i; rows past the real prefill tokens are cleared.
            t = td + i
            live_p = in_step & (t < nt)
            pos_p = tl.load(positions + t, mask=live_p, other=0).to(tl.int32)
            n_p = tl.minimum(tl.maximum(pos_p + 1, 0) // C128A_RATIO, C128A_WIDTH)
            c128a_rows(c128a_prefill_out, c128a_prefill_lens_out, i, in_step,
                       tl.where(live_p, n_p, 0), block_table, bt_stride, i.to(tl.int64),
                       True, C128A_WIDTH, C128A_ENTRIES, BLOCK_C)

    return swa_decode_kernel


def _build_triton(out, slot_mapping, positions, token_to_req, swa_block_table, swa_block_size,
                  block_table, c128a_ratio, c128a_block_entries, num_tokens, num_decode_tokens,
                  decode_rows, prefill_rows, step_counts, block_tokens) -> None:
    has_c128a = out.c128a_indices is not None
    if block_tokens is None:
        block_tokens = 64 if triton_interpreted() else 2
    c128a_width = out.c128a_width
    # Unused pointer arguments (no C128A layers, no prefill rows, static counts) point at
    # views of the right dtype; never dereferenced.
    bt = block_table if has_c128a else swa_block_table
    prefill_out = out.c128a_prefill_indices if prefill_rows else out.swa_indices
    prefill_lens = out.c128a_prefill_lens if prefill_rows else out.swa_lens
    block_c = min(pow2_at_least(c128a_width, 16), 1024)
    grid = (grid_size(max(num_tokens, decode_rows), block_tokens),)
    launch(_swa_decode_kernel(), grid,
        slot_mapping, positions, token_to_req,
        swa_block_table, swa_block_table.stride(0), bt, bt.stride(0),
        out.is_valid_token, out.swa_indices, out.swa_lens,
        out.c128a_indices if has_c128a else out.swa_indices,
        out.c128a_lens if has_c128a else out.swa_lens,
        prefill_out, prefill_lens,
        out.swa_lens if step_counts is None else step_counts,
        num_tokens, num_decode_tokens, decode_rows,
        WINDOW=out.window, SWA_BLOCK=swa_block_size, HAS_C128A=has_c128a,
        PREFILL_ROWS=prefill_rows, DEVICE_COUNTS=step_counts is not None,
        C128A_WIDTH=max(c128a_width, 1), C128A_ENTRIES=max(c128a_block_entries, 1),
        C128A_RATIO=c128a_ratio, BLOCK_T=block_tokens,
        BLOCK_W=pow2_at_least(out.window, 16),
        BLOCK_C=block_c,
    )

