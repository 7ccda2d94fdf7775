"""The host checks of bounded replay's per-request input (``docs/spec/deepseek-v41.md``
§8.1), run before anything is staged.

A request replays only while it prefills: the staging hands ``replay_start`` to the prefill
requests of the split (``D <= b < k``) and 0 to the decodes in front of them, so a non-zero
start given for a decode would be dropped without a word -- and the decode's window would
then reach below the replay, into SWA KV that was never written. That is an error here.
"""

from __future__ import annotations

import numpy as np

from staticattn.arena.config import ArenaConfig
from staticattn.errors import InvalidBatchError
from staticattn.validation.values import check_non_negative

__all__ = ["check_replay_start", "replay_start_array"]


def replay_start_array(config: ArenaConfig, replay_start, num_reqs: int) -> np.ndarray:
    """``replay_start`` as a host int array ``(num_reqs,)``, after the checks that need no
    lengths: the config has bounded replay, one int per request, none negative. Raises
    :class:`InvalidBatchError` otherwise."""
    if not config.bounded_replay:
        raise InvalidBatchError(f"replay_start was given, but architecture="
                                f"{config.architecture!r} has no bounded replay: pass None")
    rs = np.asarray(replay_start)
    if rs.ndim != 1 or rs.shape[0] != num_reqs or (
            rs.size and not np.issubdtype(rs.dtype, np.integer)):
        raise InvalidBatchError(f"replay_start must be {num_reqs} ints (one per request), got "
                                f"shape {rs.shape}, dtype {rs.dtype}")
    check_non_negative("replay_start", rs)
    return rs


def check_replay_start(config: ArenaConfig, replay_start, query_lens: np.ndarray,
                       seq_lens: np.ndarray) -> None:
    """Raise :class:`InvalidBatchError` unless ``replay_start`` (host ints ``(num_reqs,)`` or
    None) passes :func:`replay_start_array`, each start lies inside its request's context
    (``<= seq_lens - query_lens``) and the decodes (the leading requests whose query is at
    most ``decode_threshold``) carry 0. Host ints ``query_lens``, ``seq_lens``
    ``(num_reqs,)``."""
    if replay_start is None:
        return
    rs = replay_start_array(config, replay_start, query_lens.shape[0])
    if not rs.any():
        return
    context = seq_lens.astype(np.int64) - query_lens
    bad = np.flatnonzero(rs > context)
    if bad.size:
        b = int(bad[0])
        raise InvalidBatchError(f"replay_start[{b}]={int(rs[b])} is outside [0, seq_lens - "
                                f"query_lens = {int(context[b])}]")
    threshold = config.decode_threshold
    over = query_lens > threshold
    num_decodes = int(over.argmax()) if over.any() else query_lens.shape[0]
    given = np.flatnonzero(rs[:num_decodes])
    if given.size:
        b = int(given[0])
        raise InvalidBatchError(
            f"replay_start[{b}]={int(rs[b])} is given for a decode (query_lens[{b}]="
            f"{int(query_lens[b])} <= decode_threshold={threshold}, before the first "
            "prefill): only prefill requests replay; pass 0")
