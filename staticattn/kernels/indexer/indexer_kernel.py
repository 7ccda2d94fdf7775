"""The indexer's one Triton kernel and its two launch modes.

* decode mode: the per-token decode lengths (native or flatten layout) and, flattening, the
  expanded block table (:mod:`staticattn.kernels.indexer.decode_tensors`);
* slots mode: the compressed slot mapping of tokens ``[0, num_slot_tokens)``
  (:mod:`staticattn.kernels.indexer.index_slots`).

A uniform decode step runs both modes in one launch. Both callers import this module, which
imports neither of them.
"""

from __future__ import annotations

from staticattn.kernels.compressed.slot_gate import SlotGate, slot_gate_jit
from staticattn.kernels.dcp.ownership import DCPShard, triton_dcp_helpers
from staticattn.kernels.runtime.compiled_launch import launch
from staticattn.kernels.runtime.deferred import lazy_jit
from staticattn.kernels.staging.step_counts import step_counts_jit

__all__ = ["COLS", "launch_decode_kernel", "launch_slots_kernel", "table_tiles_shape"]

#: Rows (decode) or tokens (slots) per program.
BLOCK = 128
#: Block-table columns per program of the flatten layout.
COLS = 64


def table_tiles_shape(rows: int, columns: int) -> tuple[int, int]:
    """The flags of an expanded block table of ``rows`` x ``columns``: one per tile of
    ``BLOCK`` rows and ``COLS`` columns, the tile one program writes."""
    return (rows + BLOCK - 1) // BLOCK, (columns + COLS - 1) // COLS


def launch_decode_kernel(
    extent: int, col_blocks: int, qsl, seq_lens, block_table, positions, token_to_req,
    decode_lens, decode_seq_lens, table_out, table_tiles, slots_out, num_decodes: int,
    num_rows: int, width: int, num_cols: int, compress_ratio: int, storage_block_size: int,
    num_slot_tokens: int, *, decode: bool, flatten: bool, step_counts=None,
    dcp: DCPShard | None = None, global_seq_lens=None, gate: SlotGate | None = None,
) -> None:
    """One launch of the indexer kernel over ``extent`` rows or tokens: the decode tensors
    (``decode``) and/or the compressed slots of tokens ``[0, num_slot_tokens)``
    (``num_slot_tokens > 0``). With ``step_counts`` (int32 device, the staging's
    ``[k, nt, D, Td]``) the decode extent is read there and ``num_decodes`` / ``num_rows``
    are only the static capacities. ``table_tiles`` (flatten): int32 device
    :func:`table_tiles_shape` of ``table_out``, nonzero where a tile may hold a nonzero entry
    (the kernel keeps it so). With ``dcp`` (decode context parallelism) lengths and
    slots are this rank's, and ``global_seq_lens`` receives the global lengths. With
    ``gate`` (V4.1) the tokens it stops write no compressed slot."""
    sharded = dcp is not None and dcp.world > 1
    world, rank, interleave = (dcp.world, dcp.rank, dcp.interleave) if sharded else (1, 0, 1)
    # One program per BLOCK rows or tokens, and (flatten) one per table tile: a 1-D grid
    # as long as the longer of the two, each program taking its row block and its tile.
    tiles = (num_rows + BLOCK - 1) // BLOCK * col_blocks if flatten else 0
    launch(_decode_kernel(), (max((extent + BLOCK - 1) // BLOCK, tiles),),
        qsl, seq_lens, block_table, block_table.stride(0), positions, token_to_req,
        decode_lens, decode_seq_lens, table_out, table_out.stride(0), table_tiles,
        table_tiles.stride(0), slots_out,
        qsl if step_counts is None else step_counts,
        decode_seq_lens if global_seq_lens is None else global_seq_lens,
        num_decodes, num_rows, width, num_cols, col_blocks, compress_ratio,
        storage_block_size, num_slot_tokens, world, rank, interleave,
        *(gate.launch_args(qsl) if gate is not None else (slots_out, qsl, 0)),
        DECODE=decode, FLATTEN=flatten, SLOTS=num_slot_tokens > 0,
        DEVICE_COUNTS=step_counts is not None, DCP=sharded, GATE=gate is not None,
        REPLAY=gate is not None and gate.replay_start is not None, BLOCK=BLOCK, COLS=COLS,
    )


def launch_slots_kernel(qsl, positions, token_to_req, block_table, out, num_reqs: int,
                        num_tokens: int, storage_block_size: int, compress_ratio: int,
                        dcp: DCPShard | None = None, gate: SlotGate | None = None) -> None:
    """The kernel in its slots-only mode: compressed slots of tokens ``[0, num_tokens)``
    (the decode-tensor arguments are unused there; ``out`` stands in for them)."""
    launch_decode_kernel(
        num_tokens, 1, qsl, out, block_table, positions,
        token_to_req, out, out, block_table, block_table, out, num_reqs, 0, 1, 0, compress_ratio,
        storage_block_size, num_tokens, decode=False, flatten=False, dcp=dcp, gate=gate,
    )


@lazy_jit(step_counts_jit, triton_dcp_helpers, slot_gate_jit)
def _decode_kernel(triton, tl, live_count, SLOT_DECODES, SLOT_DECODE_TOKENS, dcp_local_count_tl,
                   dcp_owner_tl, dcp_local_index_tl, gate_allows, **_):
    @triton.jit
    def decode_kernel(
        qsl, seq_lens, block_table, bt_stride, positions, token_to_req,
        decode_lens, decode_seq_lens, table_out, table_stride, tiles, tiles_stride, slots_out,
        counts,
        global_seq_lens, num_decodes, num_rows, width, num_cols, col_blocks, compress_ratio,
        storage_bs, num_slot_tokens, dcp_world, dcp_rank, dcp_interleave, own_slots,
        replay_start, window,
        DECODE: tl.constexpr, FLATTEN: tl.constexpr, SLOTS: tl.constexpr,
        DEVICE_COUNTS: tl.constexpr, DCP: tl.constexpr, GATE: tl.constexpr,
        REPLAY: tl.constexpr, BLOCK: tl.constexpr, COLS: tl.constexpr,
    ):
        pid = tl.program_id(0)
        i = pid * BLOCK + tl.arange(0, BLOCK)
        if SLOTS:
            if pid * BLOCK < num_slot_tokens:
                # Compressed slot of token i (spec §4.5): only the token completing a group
                # of R positions writes. Positions of real tokens are >= 0, so Triton's
                # truncating // and % agree with the spec's floor semantics.
                in_range = i < num_slot_tokens
                real = in_range & (i < tl.load(qsl + num_decodes))
                pos = tl.load(positions + i, mask=real, other=-1)
                valid = real & (pos >= 0) & ((pos + 1) % compress_ratio == 0)
                if GATE:
                    # V4.1's gate: own slot -1 or recomputed by bounded replay (spec §5.1).
                    req = tl.load(token_to_req + i, mask=real, other=0)
                    valid = valid & gate_allows(own_slots, replay_start, window, i, pos, req,
                                                real, REPLAY)
                k = tl.where(valid, pos, 0) // compress_ratio
                if DCP:
                    # Only the rank that holds entry k writes it, at its local index.
                    valid = valid & (dcp_owner_tl(k, dcp_world, dcp_interleave) == dcp_rank)
                    k = dcp_local_index_tl(k, dcp_world, dcp_interleave)
                owner = tl.load(token_to_req + i, mask=valid, other=0).to(tl.int64)
                block = tl.load(block_table + owner * bt_stride + k // storage_bs,
                                mask=valid, other=0)
                slot = block.to(tl.int64) * storage_bs + k % storage_bs
                tl.store(slots_out + i, tl.where(valid, slot, -1), mask=in_range)
        if not DECODE:
            return
        # The real decodes: D requests, Td tokens; the static extents only bound them.
        decodes = live_count(counts, SLOT_DECODES, num_decodes, DEVICE_COUNTS)
        if DEVICE_COUNTS:
            decode_tokens = live_count(counts, SLOT_DECODE_TOKENS, 0, DEVICE_COUNTS)
        else:  # the launch passes no token count: the decodes' query starts give it
            decode_tokens = tl.load(qsl + num_decodes)
        if FLATTEN:
            rows = i < num_rows
            real = rows & (i < decode_tokens)
            pos = tl.load(positions + i, mask=real, other=0).to(tl.int32)
            lens = tl.where(real, tl.maximum(pos + 1, 0) // compress_ratio, 0)
            if DCP:
                # Localised after the per-token expansion (localising L_b first and then
                # expanding would be wrong: [8, 9, 10] -> [4, 4, 5] on rank 1 of 2).
                tl.store(global_seq_lens + i, lens, mask=rows)
                lens = dcp_local_count_tl(lens, dcp_world, dcp_rank, dcp_interleave)
            tl.store(decode_seq_lens + i, lens, mask=rows)
            tl.store(decode_lens + i, tl.full([BLOCK], 1, tl.int32), mask=rows)
            # Every column of every row, padded rows all 0: no stale table entries. This
            # program's tile is BLOCK rows x COLS columns, the tile_row-th and col_block-th.
            # It is written when it holds a real row or its flag says an earlier step left
            # a nonzero entry in it; a clean tile of padding is all 0 already, and the
            # capacity-wide copy costs as much as the rest of the step. The program owns its
            # tile and its flag.
            tile_row = pid // col_blocks
            col_block = pid - tile_row * col_blocks
            first_row = tile_row * BLOCK
            if first_row < num_rows:
                r = first_row + tl.arange(0, BLOCK)
                in_view = r < num_rows
                real_rows = in_view & (r < decode_tokens)
                tile = tiles + tile_row * tiles_stride + col_block
                holds_real = first_row < decode_tokens
                dirty = tl.load(tile) != 0
                if holds_real | dirty:
                    req = tl.load(token_to_req + r, mask=real_rows, other=0).to(tl.int64)
                    cols = col_block * COLS + tl.arange(0, COLS)
                    in_cols = cols < num_cols
                    src = block_table + req[:, None] * bt_stride + cols[None, :]
                    row = tl.load(src, mask=real_rows[:, None] & in_cols[None, :], other=0)
                    dst = table_out + r.to(tl.int64)[:, None] * table_stride + cols[None, :]
                    tl.store(dst, row, mask=in_view[:, None] & in_cols[None, :])
                    # Rows past num_rows (outside this view) were not cleared: a dirty tile
                    # reaching past it stays dirty.
                    straddles = first_row + BLOCK > num_rows
                    tl.store(tile, (holds_real | (dirty & straddles)).to(tl.int32))
        else:
            reqs = i < num_decodes
            live = reqs & (i < decodes)
            start = tl.load(qsl + i, mask=live, other=0)
            end = tl.load(qsl + i + 1, mask=live, other=0)
            tl.store(decode_lens + i, end - start, mask=reqs)
            cells = i < num_decodes * width
            b = i // width
            j = i - b * width
            seq_len = tl.load(seq_lens + b, mask=cells & (b < decodes), other=0)
            lens = tl.maximum(seq_len - width + 1 + j, 0) // compress_ratio
            if DCP:
                tl.store(global_seq_lens + i, lens, mask=cells)
                lens = dcp_local_count_tl(lens, dcp_world, dcp_rank, dcp_interleave)
            tl.store(decode_seq_lens + i, lens, mask=cells)

    return decode_kernel
