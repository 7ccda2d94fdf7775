"""The sparse sliding-window decode build, SWA window and C128A top-k, in one kernel.

One launch over the step's ``num_tokens`` tokens writes, for every token ``t``:

* ``is_valid_token[t] = slot_mapping[t] >= 0``;

and for every decode token ``t < num_decode_tokens`` (request ``b``, absolute position ``p``):

* the SWA window (spec §6.6): the ``len = min(p + 1, W)`` most recent positions including
  ``p`` itself, ``pos = p + 1 - len + o`` for ``o < len``, as flat SWA slots
  ``swa_bt[b, pos // bs] * bs + pos % bs``; ``-1`` for ``o >= len``;
* the C128A top-k (spec §7): the ``n_c = min((p + 1) // 128, maxC)`` complete compressed
  groups, ``o < n_c`` as flat slots ``bt[b, o // cb] * cb + o % cb`` with ``cb = block_size //
  128`` entries per main-group block; ``-1`` for ``o >= n_c``.

A token whose slot is -1 (graph padding, or told so by the engine) gets length 0 and a row of
-1 in both, so no row is ever stale. Example (W = 4, bs = 4): a token at ``p = 4`` whose
request's SWA block row is ``[7, 2]`` gets ``[29, 30, 31, 8]``, length 4.

Both implementations are graph-safe: the extents are static ints, there is no host read and
no branch on data; the torch version allocates temporaries, the Triton one nothing. Rows are
written whole (``W`` and ``maxC`` columns), and the row strides are the output buffers' own,
fixed by the config, never by the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from staticattn.errors import ArenaError
from staticattn.kernels.backend import triton_interpreted
from staticattn.kernels.lazy import lazy_jit

__all__ = ["SWADecodeOutputs", "build_swa_decode"]

#: Uncompressed tokens per C128A compressed entry.
C128A_RATIO = 128


@dataclass(frozen=True, slots=True)
class SWADecodeOutputs:
    """The arena views :func:`build_swa_decode` writes.

    is_valid_token : bool ``(>= num_tokens,)``
    swa_indices : int32 ``(>= num_decode_tokens, 1, W)``, contiguous rows
    swa_lens : int32 ``(>= num_decode_tokens,)``
    c128a_indices : int32 ``(>= num_decode_tokens, 1, maxC)`` or None (no C128A layers)
    c128a_lens : int32 ``(>= num_decode_tokens,)`` or None
    """

    is_valid_token: torch.Tensor
    swa_indices: torch.Tensor
    swa_lens: torch.Tensor
    c128a_indices: torch.Tensor | None = None
    c128a_lens: torch.Tensor | None = None

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
    c128a_block_entries: int,
    num_tokens: int,
    num_decode_tokens: int,
    block_tokens: int | None = None,
) -> None:
    """Write the validity mask of every token and the SWA / C128A rows of the decode tokens.

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
    num_tokens, num_decode_tokens : int
        Static extents: tokens of the step (padding included) and its leading decode tokens.
    block_tokens : int, optional
        Tokens per Triton program; default 2 compiled (many small programs keep every SM
        busy on the wide C128A rows), 64 interpreted (the CPU interpreter pays per program).
    """
    if num_tokens == 0:
        return
    if backend == "triton":
        _build_triton(out, slot_mapping, positions, token_to_req, swa_block_table,
                      swa_block_size, block_table, c128a_block_entries, num_tokens,
                      num_decode_tokens, block_tokens)
    else:
        _build_torch(out, slot_mapping, positions, token_to_req, swa_block_table,
                     swa_block_size, block_table, c128a_block_entries, num_tokens,
                     num_decode_tokens)


def _build_torch(out, slot_mapping, positions, token_to_req, swa_block_table, swa_block_size,
                 block_table, c128a_block_entries, num_tokens, num_decode_tokens) -> None:
    valid = slot_mapping[:num_tokens] >= 0
    out.is_valid_token[:num_tokens].copy_(valid)
    td = num_decode_tokens
    if td == 0:
        return
    # int32 throughout (the outputs are int32): half the temporaries of int64 on wide rows.
    live = valid[:td, None]
    req = token_to_req[:td, None]
    pos = positions[:td, None].int()
    window_len = torch.clamp(pos + 1, max=out.window)
    out.swa_lens[:td].copy_(torch.where(live, window_len, 0)[:, 0])
    out.swa_indices[:td, 0].copy_(_gather_slots(
        swa_block_table, req, pos + 1 - window_len, window_len, live, out.window, swa_block_size
    ))
    if out.c128a_indices is None:
        return
    n_c = torch.clamp((pos + 1) // C128A_RATIO, max=out.c128a_width)
    out.c128a_lens[:td].copy_(torch.where(live, n_c, 0)[:, 0])
    out.c128a_indices[:td, 0].copy_(_gather_slots(
        block_table, req, torch.zeros_like(n_c), n_c, live, out.c128a_width, c128a_block_entries
    ))


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

    @triton.jit(do_not_specialize=["num_tokens", "num_decode_tokens"])
    def swa_decode_kernel(
        slot_mapping, positions, token_to_req,
        swa_block_table, swa_bt_stride, block_table, bt_stride,
        is_valid_out, swa_indices_out, swa_lens_out, c128a_indices_out, c128a_lens_out,
        num_tokens, num_decode_tokens,
        WINDOW: tl.constexpr, SWA_BLOCK: tl.constexpr, HAS_C128A: tl.constexpr,
        C128A_WIDTH: tl.constexpr, C128A_ENTRIES: tl.constexpr, C128A_RATIO: tl.constexpr,
        BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr,
    ):
        # Axis 0: blocks of tokens. Axis 1: blocks of C128A columns, so a wide C128A row
        # (8192 entries at 1M context) is written by many programs at once; column block 0
        # also writes the validity mask, the SWA window and the lengths.
        pid = tl.program_id(0)
        col_block = tl.program_id(1)
        t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
        in_step = t < num_tokens
        slot = tl.load(slot_mapping + t, mask=in_step, other=-1)
        valid = slot >= 0
        if col_block == 0:
            tl.store(is_valid_out + t, valid, mask=in_step)
        # Programs holding only prefill tokens are done (a branch on the program id and a
        # launch argument, both fixed for the launch).
        if pid * BLOCK_T < num_decode_tokens:
            is_dec = t < num_decode_tokens
            live = is_dec & valid
            row = t.to(tl.int64)
            req = tl.load(token_to_req + t, mask=is_dec, other=0).to(tl.int64)
            pos = tl.load(positions + t, mask=is_dec, other=0).to(tl.int32)

            if col_block == 0:
                window_len = tl.minimum(pos + 1, WINDOW)
                tl.store(swa_lens_out + t, tl.where(live, window_len, 0), mask=is_dec)
                o = tl.arange(0, BLOCK_W)
                keep = live[:, None] & (o[None, :] < window_len[:, None])
                # Masked entries are 0, so // and % (truncating in Triton) see no negatives.
                p = tl.where(keep, (pos + 1 - window_len)[:, None] + o[None, :], 0)
                blk = tl.load(swa_block_table + req[:, None] * swa_bt_stride + p // SWA_BLOCK,
                              mask=keep, other=0)
                tl.store(swa_indices_out + row[:, None] * WINDOW + o[None, :],
                         tl.where(keep, blk * SWA_BLOCK + p % SWA_BLOCK, -1),
                         mask=is_dec[:, None] & (o[None, :] < WINDOW))

            if HAS_C128A:
                n_c = tl.where(live, tl.minimum((pos + 1) // C128A_RATIO, C128A_WIDTH), 0)
                if col_block == 0:
                    tl.store(c128a_lens_out + t, n_c, mask=is_dec)
                e = col_block * BLOCK_C + tl.arange(0, BLOCK_C)
                keep_c = e[None, :] < n_c[:, None]
                blk_c = tl.load(block_table + req[:, None] * bt_stride
                                + e[None, :] // C128A_ENTRIES, mask=keep_c, other=0)
                tl.store(c128a_indices_out + row[:, None] * C128A_WIDTH + e[None, :],
                         tl.where(keep_c, blk_c * C128A_ENTRIES + e[None, :] % C128A_ENTRIES,
                                  -1),
                         mask=is_dec[:, None] & (e[None, :] < C128A_WIDTH))

    return swa_decode_kernel


def _build_triton(out, slot_mapping, positions, token_to_req, swa_block_table, swa_block_size,
                  block_table, c128a_block_entries, num_tokens, num_decode_tokens,
                  block_tokens) -> None:
    import triton

    _check_rows(out)
    has_c128a = out.c128a_indices is not None
    if block_tokens is None:
        block_tokens = 64 if triton_interpreted() else 2
    c128a_width = out.c128a_width
    # Unused pointer arguments of an SWA-only model point at SWA views; never dereferenced.
    bt = block_table if has_c128a else swa_block_table
    block_c = min(max(triton.next_power_of_2(c128a_width), 16), 1024)
    col_blocks = triton.cdiv(c128a_width, block_c) if has_c128a else 1
    grid = (triton.cdiv(num_tokens, block_tokens), col_blocks)
    _swa_decode_kernel()[grid](
        slot_mapping, positions, token_to_req,
        swa_block_table, swa_block_table.stride(0), bt, bt.stride(0),
        out.is_valid_token, out.swa_indices, out.swa_lens,
        out.c128a_indices if has_c128a else out.swa_indices,
        out.c128a_lens if has_c128a else out.swa_lens,
        num_tokens, num_decode_tokens,
        WINDOW=out.window, SWA_BLOCK=swa_block_size, HAS_C128A=has_c128a,
        C128A_WIDTH=max(c128a_width, 1), C128A_ENTRIES=max(c128a_block_entries, 1),
        C128A_RATIO=C128A_RATIO, BLOCK_T=block_tokens,
        BLOCK_W=max(triton.next_power_of_2(out.window), 16),
        BLOCK_C=block_c,
    )


def _check_rows(out: SWADecodeOutputs) -> None:
    """The kernel addresses rows by their width: the views must be contiguous rows."""
    for name in ("swa_indices", "c128a_indices"):
        view = getattr(out, name)
        if view is not None and view.stride(0) != view.shape[-1]:
            raise ArenaError(
                f"{name} must have contiguous rows of {view.shape[-1]} entries, got row "
                f"stride {view.stride(0)}; pass the arena view, not a strided slice"
            )
