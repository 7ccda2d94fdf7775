"""The checked entry to the prefill-context-parallel split: the step's host checks
(:func:`staticattn.validation.pcp_step.check_pcp_step`) first, then the device split into
the views -- so a step that does not fit raises its typed error with every view as it was."""

from __future__ import annotations

import torch

from staticattn.arena.pcp_config import PCPConfig
from staticattn.builders.pcp.rank_rows import RowViews, build_rows
from staticattn.validation.pcp_step import check_pcp_step

__all__ = ["build_checked_rows"]


def build_checked_rows(cfg: PCPConfig, host: dict, staged: dict[str, torch.Tensor],
                       out: RowViews, *, max_num_batched_tokens: int,
                       prefill_workspace: int | None = None) -> RowViews:
    """Check the step, then write every rank's rows into ``out``.

    Parameters
    ----------
    host : dict
        The real requests' host arrays ``query_start_loc`` ``(S + 1,)``, ``is_prefilling``
        and ``num_computed`` ``(S,)`` (what the engine stages; never read from the device).
    staged : dict of tensors
        The same step staged at capacity (``query_start_loc`` int32 ``(max_num_seqs + 1,)``,
        ``is_prefilling`` bool and ``num_computed`` int32 ``(max_num_seqs,)``).
    out : RowViews
        Its ``N`` (``token_to_global.shape[1]``) is the bucket, its ``hidden_restore_idx``
        the global token capacity.
    """
    check_pcp_step(cfg, host["query_start_loc"], host["is_prefilling"], host["num_computed"],
                   num_tokens_padded=out.token_to_global.shape[1],
                   max_num_batched_tokens=max_num_batched_tokens,
                   max_num_tokens=out.hidden_restore_idx.numel(),
                   prefill_workspace=prefill_workspace)
    return build_rows(cfg, staged["query_start_loc"], staged["is_prefilling"],
                      staged["num_computed"], out)
