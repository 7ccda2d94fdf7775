"""Decode attention's compressed operand from the indexer's top-k (``docs/spec/deepseek-v41.md``
§7.1, the reference's ``compute_global_topk_indices_and_lens``).

A decode token's top-k row holds request-local compressed indices ``k`` (-1 = none). The
attention kernel reads global slots of the layer's compressed cache instead, with a length:

* ``global[t, j] = bt[b, k // S] * S + k % S`` for ``k >= 0`` (``b`` the token's request,
  ``S`` entries per page of the cache's table ``bt``); -1 stays -1;
* ``lens[t] = #{j : k_j >= 0}``, and 0 for an invalid token (its own slot -1, graph
  padding, or past the step's decode tokens), whose row is all -1.

Example (spec §11 case 2, c2a, ``S = 4``): table rows ``[11, 0]`` and ``[12, 13]``, top-k rows
``[0, 1, 2, -1]`` and ``[4, 3, 0, 1]`` -> ``[44, 45, 46, -1]``, ``[52, 51, 48, 49]``, lengths
``[3, 4]``.

Difference from the reference, on purpose: an index whose page lies past the table's width
(which a correct indexer never produces) reads nothing: -1, not counted.

With ``entry_counts`` the short-context fill (``vllm-0.33-extras.md`` §4,
:mod:`staticattn.kernels.indexer.short_topk_fill`) is decided per row in the same launch: a token
whose
``n = n_c(p)`` fits the width ``K`` reads ``k = j`` for ``j < n`` (then -1) instead of its
top-k row, which a layer may then leave unscored.

Under decode context parallelism (``dcp``, the shard of the cache's entries: interleave
``I // R``) the row holds the merged global top-k (request-global entry ids,
:mod:`staticattn.kernels.dcp.topk_merge`) and the rank attends the entries it holds: ``k``
owned by this rank becomes its local index (:func:`~staticattn.kernels.dcp.ownership.
dcp_local_index`) and then a slot through the rank's table; an entry another rank holds is
-1 and not counted. The short-context fill decides on the global ``n_c(p)``, the same on
every rank. Example (world 2, ``J = I // R = 1``, ``S = 4``, row ``[0, 1, 2, 3, -1]``, table
row ``[5]``): rank 0 ``[20, -1, 21, -1, -1]`` length 2; rank 1 ``[-1, 20, -1, 21, -1]``.
"""

from __future__ import annotations

import torch

from staticattn.kernels.dcp.ownership import (
    DCPShard,
    dcp_local_index,
    dcp_owner,
    triton_dcp_helpers,
)
from staticattn.kernels.runtime.compiled_launch import launch_rows
from staticattn.kernels.runtime.deferred import lazy_jit
from staticattn.kernels.staging.stage_inputs import COUNT_DECODE_TOKENS
from staticattn.kernels.staging.step_counts import step_counts_jit

__all__ = ["global_topk_slots"]


def global_topk_slots(
    backend: str,
    topk_indices: torch.Tensor,
    token_to_req: torch.Tensor,
    own_slots: torch.Tensor,
    block_table: torch.Tensor,
    out: torch.Tensor,
    lens_out: torch.Tensor,
    *,
    num_rows: int,
    entries_per_block: int,
    step_counts: torch.Tensor | None = None,
    entry_counts: torch.Tensor | None = None,
    dcp: DCPShard | None = None,
) -> None:
    """Write the global slots and lengths of decode rows ``[0, num_rows)``.

    Parameters
    ----------
    topk_indices : int32 device ``(>= num_rows, K)``, unit column stride
        Request-local compressed indices per decode token, -1 = none.
    token_to_req : int32 device ``(>= num_rows,)``
    own_slots : int64 device ``(>= num_rows,)``
        The staged slot mapping: a token whose slot is -1 is invalid.
    block_table : int32 device ``(>= num_reqs, C)``, unit column stride
        The table of the layer's compressed KV cache.
    out : int32 device ``(>= num_rows, K)``, unit column stride (a ``(rows, 1, K)`` view's
        rows may be passed flattened)
    lens_out : int32 device ``(>= num_rows,)``
    num_rows : int
        Static extent of the decode rows.
    entries_per_block : int
        ``S``.
    step_counts : int32 device ``(4,)`` or None
        The staging's ``[k, nt, D, Td]``: rows at or past ``Td`` are invalid (a build whose
        split is decided on the device). None: every row is a decode token.
    entry_counts : int32 device ``(>= num_rows,)`` or None
        ``n_c(p)`` per row (global under DCP): the short-context fill; None: no fill.
    dcp : DCPShard or None
        The shard of the cache's entries (interleave ``I // R``): only this rank's entries,
        at their local indices. None: no context parallelism.

    Graph-safe with either backend: static extents, no host read.
    """
    if num_rows == 0:
        return
    width = topk_indices.shape[1]
    world, rank, interleave = dcp if dcp is not None else (1, 0, 1)
    if backend == "triton":
        launch_rows(_kernel(), num_rows, width, topk_indices, topk_indices.stride(0),
                    token_to_req, own_slots, block_table, block_table.stride(0),
                    block_table.shape[1], out, out.stride(0), lens_out,
                    step_counts if step_counts is not None else lens_out,
                    entry_counts if entry_counts is not None else lens_out, num_rows, width,
                    entries_per_block, world, rank, interleave,
                    DEVICE_COUNTS=step_counts is not None, FILL=entry_counts is not None,
                    DCP=world > 1)
        return
    rows = torch.arange(num_rows, device=out.device)
    valid = own_slots[:num_rows] >= 0
    if step_counts is not None:
        valid = valid & (rows < step_counts[COUNT_DECODE_TOKENS])
    k = topk_indices[:num_rows].long()
    if entry_counts is not None:
        n = entry_counts[:num_rows].long()[:, None]
        cols = torch.arange(width, device=out.device)[None, :]
        k = torch.where(n <= width, torch.where(cols < n, cols, -1), k)
    if world > 1:
        held = (k >= 0) & (dcp_owner(k.clamp(min=0), world, interleave) == rank)
        k = torch.where(held, dcp_local_index(k.clamp(min=0), world, interleave), -1)
    col = torch.div(k, entries_per_block, rounding_mode="floor")
    ok = valid[:, None] & (k >= 0) & (col < block_table.shape[1])
    req = torch.where(valid, token_to_req[:num_rows].long(), 0)
    block = block_table[req[:, None], torch.where(ok, col, 0)].long()
    slots = block * entries_per_block + k % entries_per_block
    out[:num_rows].copy_(torch.where(ok, slots, -1))
    lens_out[:num_rows].copy_(ok.sum(dim=1))


@lazy_jit(step_counts_jit, triton_dcp_helpers)
def _kernel(triton, tl, live_count, SLOT_DECODE_TOKENS, dcp_owner_tl, dcp_local_index_tl, **_):
    @triton.jit
    def global_topk_kernel(
        topk, topk_stride, token_to_req, own_slots, table, table_stride, num_cols, out,
        out_stride, lens_out, counts, entry_counts, num_rows, width, entries, world, rank,
        interleave, DEVICE_COUNTS: tl.constexpr, FILL: tl.constexpr, DCP: tl.constexpr,
        ROWS: tl.constexpr, COLS: tl.constexpr,
    ):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        in_rows = rows < num_rows
        live = in_rows & (rows < live_count(counts, SLOT_DECODE_TOKENS, num_rows, DEVICE_COUNTS))
        valid = live & (tl.load(own_slots + rows, mask=live, other=-1) >= 0)
        req = tl.load(token_to_req + rows, mask=valid, other=0).to(tl.int64)
        if FILL:
            n = tl.load(entry_counts + rows, mask=valid, other=0)
            fits = valid & (n <= width)
        rows64 = rows.to(tl.int64)
        lens = tl.zeros([ROWS], dtype=tl.int32)
        for c0 in range(0, width, COLS):
            cols = c0 + tl.arange(0, COLS)
            cells = in_rows[:, None] & (cols < width)[None, :]
            k = tl.load(topk + rows64[:, None] * topk_stride + cols[None, :],
                        mask=valid[:, None] & cells, other=-1)
            if FILL:
                fill = tl.where(cols[None, :] < n[:, None], cols[None, :], -1)
                k = tl.where(fits[:, None], fill, k)
            if DCP:
                e = tl.maximum(k, 0)
                held = (k >= 0) & (dcp_owner_tl(e, world, interleave) == rank)
                k = tl.where(held, dcp_local_index_tl(e, world, interleave), -1)
            # k >= 0 where it counts, so the truncating // and % are floors.
            page = k // entries
            ok = (k >= 0) & (page < num_cols)
            block = tl.load(table + req[:, None] * table_stride + page, mask=ok, other=0)
            slot = block * entries + k % entries
            tl.store(out + rows64[:, None] * out_stride + cols[None, :],
                     tl.where(ok, slot, -1), mask=cells)
            lens += tl.sum(ok.to(tl.int32), axis=1)
        tl.store(lens_out + rows, lens, mask=in_rows)

    return global_topk_kernel
