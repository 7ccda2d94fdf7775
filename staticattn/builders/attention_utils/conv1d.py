"""Causal-conv1d launch metadata, in arena views (vLLM's
``compute_causal_conv1d_metadata``).

The causal-conv1d prefill kernel runs one program per ``BLOCK_M`` tokens of each request;
program ``i`` reads its request from ``batch_ptr[i]`` and its block within the request from
``token_chunk_offset_ptr[i]``; entries past the programs hold ``PAD_SLOT_ID`` (-1).

The reference keeps these two vectors in a module global that it re-allocates
(``resize_``) when a batch needs more programs, which would move an address a graph baked.
Here they are two arena buffers sized once from the config: the programs of a step number
``sum_b cdiv(q_b, BLOCK_M) <= cdiv(max_num_batched_tokens, BLOCK_M) + max_num_seqs``.
"""

from __future__ import annotations

import numpy as np
import torch

from staticattn.arena.arena import Arena
from staticattn.arena.buffers import BufferDecl
from staticattn.arena.config import ArenaConfig, cdiv
from staticattn.errors import CapacityError, InvalidBatchError
from staticattn.staging.inputs import PAD_SLOT_ID
from staticattn.validation.values import check_non_decreasing, host_ints

__all__ = [
    "CONV1D_BLOCK_M", "conv1d_buffers", "compute_causal_conv1d_metadata",
    "max_conv1d_programs",
]

#: Tokens per causal-conv1d program (the one block size the reference covers).
CONV1D_BLOCK_M = 8

_BATCH_PTR = "conv1d.batch_ptr"
_CHUNK_OFFSET_PTR = "conv1d.token_chunk_offset_ptr"


def max_conv1d_programs(config: ArenaConfig, block_m: int = CONV1D_BLOCK_M) -> int:
    """Most programs one step can need: each request adds at most one partial block, so
    ``sum_b cdiv(q_b, M) <= cdiv(max_num_batched_tokens, M) + max_num_seqs``."""
    return cdiv(config.max_num_batched_tokens, block_m) + config.max_num_seqs


def conv1d_buffers(config: ArenaConfig, block_m: int = CONV1D_BLOCK_M) -> list[BufferDecl]:
    """The two device buffers: ``conv1d.batch_ptr`` and ``conv1d.token_chunk_offset_ptr``,
    int32 ``(max_conv1d_programs(config),)``, filled with -1 at allocation."""
    n = max_conv1d_programs(config, block_m)
    return [
        BufferDecl(_BATCH_PTR, (n,), torch.int32, fill=PAD_SLOT_ID),
        BufferDecl(_CHUNK_OFFSET_PTR, (n,), torch.int32, fill=PAD_SLOT_ID),
    ]


def compute_causal_conv1d_metadata(
    query_start_loc_p_cpu: torch.Tensor | np.ndarray,
    arena: Arena,
    block_m: int = CONV1D_BLOCK_M,
) -> tuple[dict[int, dict[str, object]], torch.Tensor, torch.Tensor]:
    """Fill the arena's conv1d views from the prefill requests' host query start locations.

    Parameters
    ----------
    query_start_loc_p_cpu : int host tensor or array ``(P + 1,)``
        Query start locations of the prefill requests (non-decreasing; need not start at 0).
    arena : Arena
        Allocated with :func:`conv1d_buffers` declared (same ``block_m``).
    block_m : int
        Tokens per program.

    Returns
    -------
    nums_dict : dict
        ``{block_m: {...}}`` with ``nums`` (int32 host ``(P,)``, programs per request
        ``cdiv(q_b, M)``), ``tot`` and ``mlist_len`` (int, the number of programs ``N``),
        ``mlist`` (int32 host ``(N,)``, request of each program), ``offsetlist`` (int32 host
        ``(N,)``, block of each program within its request), ``batch_ptr`` and
        ``token_chunk_offset_ptr`` (the arena views).
    batch_ptr, token_chunk_offset_ptr : int32 device views ``(max_conv1d_programs,)``
        ``[:N]`` = ``mlist`` / ``offsetlist``, ``[N:]`` = -1.

    Raises
    ------
    InvalidBatchError
        Query start locations on the device (reading them would sync), not 1-D, or
        decreasing.
    CapacityError
        More programs than the buffers hold (cannot happen for a batch within the config).

    Notes
    -----
    Unlike vLLM's version, the host values are taken as given (vLLM copies device query
    lengths to the host, a sync), ``mlist`` is int32 (vLLM's is int64 before its copy
    into the int32 buffer), and the views are written in place, never re-allocated. Eager
    only: the host -> device copies have host-computed lengths.

    Examples
    --------
    Query start locations ``[0, 3, 20, 28]`` (lengths ``3, 17, 8``), ``M = 8``:
    ``nums = [1, 3, 1]``, ``mlist = [0, 1, 1, 1, 2]``, ``offsetlist = [0, 0, 1, 2, 0]``.
    """
    qsl = host_ints("query_start_loc_p_cpu", query_start_loc_p_cpu, ndim=1)
    if qsl.shape[0] < 1:
        raise InvalidBatchError(
            f"query_start_loc_p_cpu must be 1-D with at least one entry, got shape {qsl.shape}"
        )
    query_lens = check_non_decreasing("query_start_loc_p_cpu", qsl)
    batch_ptr, chunk_offset_ptr = arena[_BATCH_PTR], arena[_CHUNK_OFFSET_PTR]
    nums = -(-query_lens // block_m)
    total = int(nums.sum())
    if total > batch_ptr.shape[0]:
        raise CapacityError(
            f"{total} causal-conv1d programs exceed the {batch_ptr.shape[0]} the arena holds "
            f"(cdiv(max_num_batched_tokens, {block_m}) + max_num_seqs)"
        )
    mlist = np.repeat(np.arange(nums.shape[0], dtype=np.int32), nums)
    # Block index within its request: the program's index minus its request's first program.
    offsetlist = (np.arange(total) - np.repeat(np.cumsum(nums) - nums, nums)).astype(np.int32)
    # Non-blocking from pageable memory: the driver stages the bytes before returning, so
    # there is no stream sync and nothing here can change under the copy.
    batch_ptr[:total].copy_(torch.from_numpy(mlist), non_blocking=True)
    batch_ptr[total:].fill_(PAD_SLOT_ID)
    chunk_offset_ptr[:total].copy_(torch.from_numpy(offsetlist), non_blocking=True)
    chunk_offset_ptr[total:].fill_(PAD_SLOT_ID)
    entry: dict[str, object] = {
        "nums": torch.from_numpy(nums.astype(np.int32)),
        "tot": total,
        "mlist": torch.from_numpy(mlist),
        "mlist_len": total,
        "offsetlist": torch.from_numpy(offsetlist),
        "batch_ptr": batch_ptr,
        "token_chunk_offset_ptr": chunk_offset_ptr,
    }
    return {block_m: entry}, batch_ptr, chunk_offset_ptr
