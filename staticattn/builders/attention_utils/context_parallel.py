"""Decode context parallelism: how many of a sequence's tokens each rank's KV cache holds.

The KV of one sequence is dealt to ``dcp_size`` ranks round-robin in groups of
``cp_kv_cache_interleave_size`` tokens: positions ``[k I, (k + 1) I)`` live on rank
``k % dcp_size``.
"""

from __future__ import annotations

import torch

from staticattn.errors import ConfigError, InvalidBatchError
from staticattn.kernels.dcp.ownership import dcp_local_count

__all__ = ["get_dcp_local_seq_lens"]


def get_dcp_local_seq_lens(
    seq_lens: torch.Tensor,
    dcp_size: int = 1,
    dcp_rank: int | None = None,
    cp_kv_cache_interleave_size: int = 1,
) -> torch.Tensor:
    """Tokens of each sequence stored on one decode-context-parallel rank (or on each).

    Parameters
    ----------
    seq_lens : int tensor ``(num_reqs,)``, any device
        Sequence lengths ``L_b``.
    dcp_size : int
        Ranks the KV is spread over.
    dcp_rank : int, optional
        The rank asked about; None asks about every rank.
    cp_kv_cache_interleave_size : int
        Tokens dealt to a rank at a time (``I``).

    Returns
    -------
    int32 tensor on ``seq_lens``' device
        ``(num_reqs,)`` for one rank (or for every rank when ``dcp_size == 1``), else
        ``(num_reqs, dcp_size)``. With ``base = (L // (I * dcp_size)) * I`` (whole rounds) and
        ``rem = L - base * dcp_size``, rank ``r`` holds ``base + clip(rem - r I, 0, I)``.

    Raises
    ------
    ConfigError
        Non-positive ``dcp_size`` or interleave, or a rank outside ``[0, dcp_size)``.
    InvalidBatchError
        ``seq_lens`` not 1-D.

    Notes
    -----
    Elementwise torch ops only (:func:`staticattn.kernels.dcp.ownership.dcp_local_count`, the
    formula
    the builders' kernels share): no host read, so it runs on any device and inside a graph,
    though it allocates its result and temporaries (from the graph's pool under capture).

    Examples
    --------
    >>> import torch
    >>> get_dcp_local_seq_lens(torch.tensor([10, 3]), dcp_size=2, cp_kv_cache_interleave_size=4)
    tensor([[6, 4],
            [3, 0]], dtype=torch.int32)
    >>> get_dcp_local_seq_lens(torch.tensor([10, 3]), 2, 1, 4)
    tensor([4, 0], dtype=torch.int32)
    """
    interleave = cp_kv_cache_interleave_size
    if dcp_size < 1 or interleave < 1:
        raise ConfigError(
            f"dcp_size={dcp_size} and cp_kv_cache_interleave_size={interleave} must be >= 1"
        )
    if dcp_rank is not None and not 0 <= dcp_rank < dcp_size:
        raise ConfigError(f"dcp_rank={dcp_rank} is outside [0, dcp_size={dcp_size})")
    if seq_lens.dim() != 1:
        raise InvalidBatchError(
            f"seq_lens must be 1-D (num_reqs,), got shape {tuple(seq_lens.shape)}"
        )
    lens = seq_lens.to(torch.int32)
    if dcp_rank is not None:
        return dcp_local_count(lens, dcp_size, dcp_rank, interleave)
    if dcp_size == 1:
        return lens
    return torch.stack([dcp_local_count(lens, dcp_size, r, interleave)
                        for r in range(dcp_size)], dim=1)
