"""The host checks of a step's arrays before they are staged: shapes, dtypes, consistent
lengths, padding within the staging block's capacity."""

from __future__ import annotations

import numpy as np

from staticattn.arena.config import ArenaConfig
from staticattn.errors import InvalidBatchError
from staticattn.validation.values import check_capacity, check_non_negative

__all__ = ["check_extents"]


def check_extents(config: ArenaConfig, query_lens: np.ndarray, seq_lens: np.ndarray,
                  slot_mapping: np.ndarray, pr: int, pt: int) -> None:
    """Raise before anything is written unless the host arrays are 1-D integers of
    consistent lengths, padded to ``pr`` requests and ``pt`` tokens within the staging
    block's capacity. Host ints: ``query_lens``, ``seq_lens`` ``(num_reqs,)``,
    ``slot_mapping`` ``(num_tokens,)``."""
    if query_lens.ndim != 1 or seq_lens.ndim != 1 or slot_mapping.ndim != 1:
        raise InvalidBatchError(
            "query_lens, seq_lens and slot_mapping must be 1-D, got shapes "
            f"{query_lens.shape}, {seq_lens.shape}, {slot_mapping.shape}"
        )
    for name, arr in (("query_lens", query_lens), ("seq_lens", seq_lens),
                      ("slot_mapping", slot_mapping)):
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise InvalidBatchError(f"{name} must hold integers, got dtype {arr.dtype}")
    num_reqs, num_tokens = query_lens.shape[0], slot_mapping.shape[0]
    if seq_lens.shape[0] != num_reqs:
        raise InvalidBatchError(
            f"seq_lens has {seq_lens.shape[0]} entries but query_lens has {num_reqs}"
        )
    if pr < num_reqs or pt < num_tokens:
        raise InvalidBatchError(
            f"padding ({pr} requests, {pt} tokens) is smaller than the batch "
            f"({num_reqs} requests, {num_tokens} tokens)"
        )
    check_capacity(pr, pt, config)
    check_non_negative("query_lens", query_lens)
    total = int(query_lens.sum())
    if total != num_tokens:
        raise InvalidBatchError(
            f"query_lens sum to {total} tokens but slot_mapping has {num_tokens} entries"
        )
