"""The indexer's per-token decode tensors, in one launch (spec §4.8).

Two layouts, chosen by the caller from static facts:

* **native** (plain decode, ``width = 1``; native MTP, ``width = next_n``): one row per decode
  request. ``decode_lens[b] = q_b`` and the row-major ``(num_decodes, width)`` lengths
  ``decode_seq_lens[b * width + j] = max(L_b - width + 1 + j, 0) // R`` -- token ``j`` of the
  last ``width`` tokens sees everything up to and including itself. Example H (``width = 2``,
  ``L = [10, 7, 12, 0]``): ``[[9, 10], [6, 7], [11, 12], [0, 0]]``; the reference engine leaves
  the padded row at ``[-1, 0]``, which its consumers read as uint32, so we clamp at 0.
* **flatten** (``next_n >= 3`` on Hopper): one single-token row per decode token ``t``:
  ``decode_lens[t] = 1``, ``decode_seq_lens[t] = (p(t) + 1) // R`` (``= L_b - q_b + j + 1``) and
  ``expanded_block_table[t] = block_table[b]``. Rows past the real decode tokens
  (``t >= query_start_loc[num_decodes]``, graph padding) get length 0 and an all-zero (null
  block) table row, where the reference zeroes column 0 only. Example F (``L = [10, 7, 12, 0]``,
  ``q = [3, 1, 4, 0]``): ``[8, 9, 10, 7, 9, 10, 11, 12]``.

Lengths are clamped at 0 before the floor division by ``R``, so Triton's truncating ``//``
and torch's floor ``//`` agree.

Under decode context parallelism (``dcp``) every length above is the *global* per-token one,
written to ``global_seq_lens``; ``decode_seq_lens`` gets this rank's share of it
(:func:`~staticattn.kernels.dcp.ownership.dcp_local_count` at the compressed interleave ``I // R``),
computed after the per-token expansion: world 2, rank 1, ``I = 1``, global ``[8, 9, 10]``
-> ``[4, 4, 5]`` (localising ``L_b`` first and expanding would give ``[3, 4, 5]``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from staticattn.kernels.compressed.slot_gate import SlotGate
from staticattn.kernels.dcp.ownership import DCPShard, dcp_local_count
from staticattn.kernels.indexer.index_slots import compressed_slot_mapping
from staticattn.kernels.indexer.indexer_kernel import BLOCK, COLS, launch_decode_kernel
from staticattn.kernels.staging.stage_inputs import COUNT_DECODE_TOKENS, COUNT_DECODES

__all__ = ["ExpandedTable", "indexer_decode_tensors"]


class ExpandedTable(NamedTuple):
    """The flatten layout's expanded block table and its tiles' flags.

    Attributes
    ----------
    rows : int32 device ``(>= num_rows, max_blocks)``
        The table; a build writes ``[:num_rows]``.
    tiles : int32 device ``table_tiles_shape(len(rows), max_blocks)``
        One flag per tile of the whole buffer
        (:func:`~staticattn.kernels.indexer.indexer_kernel.table_tiles_shape`), 0 where the
        tile is all 0. Only :func:`indexer_decode_tensors` writes the table and its flags: a
        clean tile of padding rows is not rewritten.
    """

    rows: torch.Tensor
    tiles: torch.Tensor

def indexer_decode_tensors(
    backend: str,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    positions: torch.Tensor,
    token_to_req: torch.Tensor,
    decode_lens: torch.Tensor,
    decode_seq_lens: torch.Tensor,
    expanded: ExpandedTable | None,
    *,
    num_decodes: int,
    num_rows: int,
    width: int,
    compress_ratio: int,
    slot_mapping_out: torch.Tensor | None = None,
    storage_block_size: int = 1,
    slot_tokens: int | None = None,
    step_counts: torch.Tensor | None = None,
    dcp: DCPShard | None = None,
    global_seq_lens: torch.Tensor | None = None,
    gate: SlotGate | None = None,
) -> None:
    """Write the decode lengths (and, flattening, the expanded block table) in one launch.

    Parameters
    ----------
    query_start_loc : int32 device ``(>= num_decodes + 1,)``
    seq_lens : int32 device ``(>= num_decodes,)``
    block_table : int32 device ``(>= num_decodes, max_blocks)``, unit column stride
    positions : int64 device ``(>= extent,)``; read when flattening or writing slots
    token_to_req : int32 device ``(>= extent,)``; read when flattening or writing slots
    decode_lens : int32 device, flat
        Written on ``[:num_decodes]`` (native) or ``[:num_rows]`` (flatten).
    decode_seq_lens : int32 device, flat
        Written on ``[:num_decodes * width]`` (native) or ``[:num_rows]`` (flatten).
    expanded : ExpandedTable or None
        None selects the native layout; a table selects the flatten layout, written on
        ``[:num_rows]``.
    num_decodes : int
        Decode requests (padded ones included).
    num_rows : int
        Flatten: decode tokens (padded ones included). Ignored by the native layout.
    width : int
        Native: columns of the lengths (``max_decode_len``, >= 1). Ignored by flatten.
    compress_ratio : int
        ``R``: lengths are counted in compressed keys.
    slot_mapping_out : int64 device ``(>= slot_tokens,)`` or None
        Also write the compressed slot mapping of tokens ``[0, slot_tokens)``, in the same
        launch (see :func:`~staticattn.kernels.indexer.index_slots.compressed_slot_mapping`);
        ``query_start_loc[num_decodes]`` must then be the step's real token count (every
        request is a decode slot: a uniform or a mixed build).
    storage_block_size : int
        ``S`` of the compressed slots.
    slot_tokens : int, optional
        Tokens of the slot mapping; default: the decode extent (a uniform decode step,
        where every token is a decode token).
    step_counts : int32 device ``(4,)`` or None
        The staging's ``[k, nt, D, Td]``: when given, the real decode requests (native) or
        tokens (flatten) are read there, ``num_decodes`` / ``num_rows`` are only the static
        extents, and everything between the two gets length 0 (and an all-zero table row):
        the build of a step of any composition, decided on the device.
    dcp : DCPShard or None
        This rank's shard of the indexer's compressed entries (``interleave = I // R``):
        ``decode_seq_lens`` and the slots become the rank's, and ``global_seq_lens`` (int32
        device, flat, same extent as ``decode_seq_lens``) receives the global lengths.
        None, or ``world == 1``: no context parallelism (``global_seq_lens`` unused).
    gate : SlotGate or None
        V4.1's gate of the slots (``compressed_slot_mapping``); None: none.

    Graph-safe with either backend: every extent is a static int.
    """
    flatten = expanded is not None
    extent = num_rows if flatten else num_decodes * width
    slot_tokens = extent if slot_tokens is None else slot_tokens
    if extent == 0:
        return
    if backend == "triton":
        num_cols = block_table.shape[1]
        col_blocks = (num_cols + COLS - 1) // COLS if flatten else 1
        # The native layout writes no table; it passes the source table as a placeholder.
        table = expanded.rows if flatten else block_table
        slots = slot_mapping_out
        launch_decode_kernel(
            max(extent, slot_tokens if slots is not None else 0), col_blocks,
            query_start_loc, seq_lens, block_table, positions, token_to_req, decode_lens,
            decode_seq_lens, table, expanded.tiles if flatten else block_table,
            decode_seq_lens if slots is None else slots, num_decodes,
            num_rows, width, num_cols, compress_ratio, storage_block_size,
            slot_tokens if slots is not None else 0, decode=True, flatten=flatten,
            step_counts=step_counts, dcp=dcp, global_seq_lens=global_seq_lens, gate=gate,
        )
        return
    if slot_mapping_out is not None:
        compressed_slot_mapping(
            "torch", query_start_loc, positions, token_to_req, block_table, slot_mapping_out,
            num_reqs=num_decodes, num_tokens=slot_tokens,
            storage_block_size=storage_block_size, compress_ratio=compress_ratio, dcp=dcp,
            gate=gate,
        )
    if step_counts is None:
        live_reqs, live_tokens = num_decodes, query_start_loc[num_decodes]
    else:
        live_reqs, live_tokens = step_counts[COUNT_DECODES], step_counts[COUNT_DECODE_TOKENS]
    sharded = dcp is not None and dcp.world > 1
    lengths = _Lengths(decode_seq_lens, global_seq_lens if sharded else None,
                       dcp if sharded else None)
    if flatten:
        _flatten_torch(block_table, positions, token_to_req, decode_lens, lengths,
                       expanded, live_tokens, num_rows, compress_ratio)
    else:
        _native_torch(query_start_loc, seq_lens, decode_lens, lengths, num_decodes,
                      live_reqs, width, compress_ratio)


class _Lengths(NamedTuple):
    """Where the per-token lengths go: ``local`` always; with ``dcp``, the global ones to
    ``global_`` and this rank's share to ``local``."""

    local: torch.Tensor
    global_: torch.Tensor | None
    dcp: DCPShard | None

    def write(self, extent: int, lens: torch.Tensor) -> None:
        if self.dcp is None:
            self.local[:extent].copy_(lens.reshape(-1))
            return
        self.global_[:extent].copy_(lens.reshape(-1))
        shard = dcp_local_count(lens, self.dcp.world, self.dcp.rank, self.dcp.interleave)
        self.local[:extent].copy_(shard.reshape(-1))


def _native_torch(qsl, seq_lens, decode_lens, lengths, num_decodes, live_reqs, width,
                  ratio):
    live = torch.arange(num_decodes, device=seq_lens.device) < live_reqs
    query_lens = qsl[1 : num_decodes + 1] - qsl[:num_decodes]
    decode_lens[:num_decodes].copy_(torch.where(live, query_lens, 0))
    j = torch.arange(width, device=seq_lens.device, dtype=seq_lens.dtype)
    lens = (seq_lens[:num_decodes, None] - (width - 1) + j).clamp_(min=0) // ratio
    lengths.write(num_decodes * width, torch.where(live[:, None], lens, 0))


def _flatten_torch(block_table, positions, token_to_req, decode_lens, lengths,
                   expanded, live_tokens, num_rows, ratio):
    t = torch.arange(num_rows, device=positions.device)
    real = t < live_tokens
    lens = (positions[:num_rows] + 1).clamp_(min=0) // ratio
    lengths.write(num_rows, torch.where(real, lens, 0))
    decode_lens[:num_rows].fill_(1)
    rows = block_table[torch.where(real, token_to_req[:num_rows].long(), 0)]
    expanded.rows[:num_rows].copy_(torch.where(real[:, None], rows, 0))
    # The flags as the kernel leaves them: every tile of [:num_rows] rewritten, dirty where
    # it holds a real row or (already dirty) reaches past num_rows.
    first_row = torch.arange(0, num_rows, BLOCK, device=positions.device)
    dirty = expanded.tiles[: first_row.shape[0]]
    keep = (first_row + BLOCK > num_rows)[:, None] & (dirty != 0)
    dirty.copy_(((first_row < live_tokens)[:, None] | keep).to(dirty.dtype))
