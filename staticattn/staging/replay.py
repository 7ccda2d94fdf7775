"""The host check of bounded replay's per-request input (``docs/spec/deepseek-v41.md`` §8.1),
run before anything is staged."""

from __future__ import annotations

import numpy as np

from staticattn.arena.config import ArenaConfig
from staticattn.errors import InvalidBatchError

__all__ = ["check_replay_start"]


def check_replay_start(config: ArenaConfig, replay_start, query_lens: np.ndarray,
                       seq_lens: np.ndarray) -> None:
    """Raise :class:`InvalidBatchError` unless ``replay_start`` (host ints ``(num_reqs,)`` or
    None) has one entry per request, each in ``[0, seq_lens - query_lens]`` (a replay starts
    inside the context), non-zero only where the config has bounded replay. Host ints
    ``query_lens``, ``seq_lens`` ``(num_reqs,)``."""
    if replay_start is None:
        return
    rs = np.asarray(replay_start)
    if rs.ndim != 1 or rs.shape[0] != query_lens.shape[0] or (
            rs.size and not np.issubdtype(rs.dtype, np.integer)):
        raise InvalidBatchError(f"replay_start must be {query_lens.shape[0]} ints (one per "
                                f"request), got shape {rs.shape}, dtype {rs.dtype}")
    if not rs.size:
        return
    if not config.bounded_replay and rs.any():
        raise InvalidBatchError(f"replay_start is non-zero, but architecture="
                                f"{config.architecture!r} has no bounded replay")
    bad = np.flatnonzero((rs < 0) | (rs > seq_lens - query_lens))
    if bad.size:
        b = int(bad[0])
        raise InvalidBatchError(
            f"replay_start[{b}]={int(rs[b])} is outside [0, seq_lens - query_lens = "
            f"{int(seq_lens[b]) - int(query_lens[b])}]")
