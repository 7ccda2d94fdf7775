"""FlashMLA-sparse's top-k -> DCP-gathered workspace rows under PCP + DCP, on the device
(``prefill-context-parallel.md`` §3.6): graph-safe, ``(T, K)`` in and out.

A prefill token's top-k value ``j`` (a request-relative global position) lives on DCP rank
``(j // I) % D`` at local index ``(j // (D I)) I + j % I``; in the rank-major workspace of its
chunk that is row ``owner * chunk_tot_seqlen + workspace_starts[entry] + local``. A value is
invalid when negative or past the block table (``local // bs >= table_width``); valid rows
are compacted to the front (a stable sort on the invalid flag, no boolean indexing), -1 after
them, and their count is ``topk_length``. Decode tokens (entry -1) get none.
"""

from __future__ import annotations

import torch

from staticattn.kernels.dcp.ownership import dcp_local_index, dcp_owner

__all__ = ["topk_workspace_rows"]


def topk_workspace_rows(topk: torch.Tensor, request_ids: torch.Tensor,
                        workspace_starts: torch.Tensor, chunk_tot_seqlen: torch.Tensor,
                        world: int, interleave: int, block_size: int, table_width: int,
                        out_rows: torch.Tensor, out_lengths: torch.Tensor) -> None:
    """Write each token's workspace rows and their count.

    Parameters
    ----------
    topk : int32 ``(T, K)`` top-k values, -1 for none.
    request_ids : int32 ``(T,)`` each token's entry, -1 for decode tokens and padding.
    workspace_starts, chunk_tot_seqlen : int32 ``(R,)`` per entry: its first row in its
        chunk's workspace, and that chunk's ``chunk_tot_seqlen`` (the rank stride).
    out_rows : int32 ``(T, K)``; out_lengths : int32 ``(T,)``.
    """
    j = topk.long()
    entry = request_ids.long()
    safe = entry.clamp(min=0)
    local = dcp_local_index(j.clamp(min=0), world, interleave)
    rows = (dcp_owner(j.clamp(min=0), world, interleave) * chunk_tot_seqlen.long()[safe, None]
            + workspace_starts.long()[safe, None] + local)
    valid = (j >= 0) & (local // block_size < table_width) & (entry >= 0)[:, None]
    order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices
    count = valid.sum(1)
    k = torch.arange(j.shape[1], device=j.device)
    out_rows.copy_(torch.where(k < count[:, None], torch.gather(rows, 1, order), -1))
    out_lengths.copy_(count)
