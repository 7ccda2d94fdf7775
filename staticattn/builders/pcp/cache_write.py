"""The slots of a layer's KV write under prefill context parallelism, on the device
(``prefill-context-parallel.md`` §3.3, §8): graph-safe, fixed ``P * N`` rows.

vLLM slices the rows by the host's decode-token count ``nd`` (``x[:nd]`` and
``all_gather(x[nd:])`` under DCP). Here every layer all-gathers all ``N`` rows of every rank
and writes them at the gathered slot mapping as is: the write mask already made the copies
vLLM leaves out PAD (replicated rows on ranks other than 0, padding), so the same tokens land
at the same slots (:func:`staticattn.reference.pcp_outputs.cache_write_rows` is the oracle).
Only the unexpanded mapping of replicated draft decode steps (as long as the local rows)
needs ``nd``, a device count.
"""

from __future__ import annotations

import torch

__all__ = ["cache_write_slots"]

PAD = -1


def cache_write_slots(slot: torch.Tensor, num_decode_tokens: torch.Tensor, num_rows: int,
                      out: torch.Tensor) -> torch.Tensor:
    """Write the slot of each written row into ``out``, PAD (-1) for rows not written.

    Parameters
    ----------
    slot : int64 ``(P * N,)`` the gathered slot mapping, or ``(N,)`` an unexpanded one.
    num_decode_tokens : int scalar tensor, the rank's decode tokens (in front).
    num_rows : int
        ``N``, the rank's local rows (static).
    out : int64 ``(P * N,)`` the rows of ``all_gather(x)`` (rank-major), or ``(N,)`` the
        local rows ``x`` when ``slot`` is unexpanded.
    """
    if slot.numel() > num_rows:
        return out.copy_(slot)
    j = torch.arange(out.numel(), device=slot.device)
    return out.copy_(torch.where(j < num_decode_tokens, slot, PAD))
