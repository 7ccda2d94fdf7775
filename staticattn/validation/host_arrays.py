"""Validation of the host arrays of one step, before they are staged: the full check
(:func:`validate_host_step`) and the replay paths' pre-screens (:func:`uniform_decode_passes`,
:func:`screen_step`).

Nothing here reads the device or writes anything.
"""

from __future__ import annotations

import numpy as np

from staticattn.arena.config import ArenaConfig
from staticattn.errors import InvalidBatchError
from staticattn.validation.extents import check_extents
from staticattn.validation.values import (
    check_block_ids,
    check_decode_first,
    check_seq_lens,
    check_slots,
    check_table_width,
    count_arg,
    host_ints,
    resolve_threshold,
    slot_bound,
    slots_within,
    tokens_per_block,
)

__all__ = ["screen_step", "uniform_decode_passes", "validate_host_step"]


def validate_host_step(
    query_lens: np.ndarray,
    seq_lens: np.ndarray,
    slot_mapping: np.ndarray,
    config: ArenaConfig,
    *,
    num_reqs_padded: int | None = None,
    num_tokens_padded: int | None = None,
    require_decode_first: bool = False,
    decode_threshold: int | None = None,
    block_table: np.ndarray | None = None,
    swa_block_table: np.ndarray | None = None,
    num_kv_blocks: int | None = None,
    num_swa_kv_blocks: int | None = None,
) -> None:
    """Check the host arrays of one step before they are staged; nothing is read from the
    device and nothing is written.

    Parameters
    ----------
    query_lens : int array ``(num_reqs,)``
        Tokens scheduled per real request.
    seq_lens : int array ``(num_reqs,)``
        Context + scheduled tokens per request.
    slot_mapping : int array ``(num_tokens,)``
        KV slot per token (``num_tokens = sum(query_lens)``), ``-1`` = do not write.
    config : ArenaConfig
    num_reqs_padded, num_tokens_padded : int, optional
        Extents after graph padding; must be at least the real ones and fit the capacity.
    require_decode_first, decode_threshold
        As for :func:`validate`.
    block_table, swa_block_table : int array ``(>= num_reqs, C)``, optional
        Host copies of the block tables the engine is about to commit; checked for width and,
        in the columns each request uses (``cdiv(L_b, block_size * dcp_world_size)``), for ids
        in ``[0, num_kv_blocks)`` (only ``>= 0`` when the pool size is not given).
    num_kv_blocks, num_swa_kv_blocks : int, optional
        Pool sizes; they also bound the slots (``< num_blocks * block_size`` of the group the
        slot mapping addresses: SWA when the config has it, else main).

    Raises
    ------
    CapacityError, InvalidBatchError
        As for :func:`validate`.

    Examples
    --------
    >>> import numpy as np
    >>> from staticattn.arena import ArenaConfig
    >>> cfg = ArenaConfig(device="cpu", max_num_seqs=4, max_model_len=64, block_size=16)
    >>> validate_host_step(np.array([1, 3]), np.array([9, 3]), np.arange(4), cfg)
    >>> validate_host_step(np.array([1, 3]), np.array([9, 70]), np.arange(4), cfg)
    Traceback (most recent call last):
    ...
    staticattn.errors.CapacityError: seq_lens[1]=70 exceeds max_model_len=64
    """
    query_lens = host_ints("query_lens", query_lens, ndim=1)
    seq_lens = host_ints("seq_lens", seq_lens, ndim=1)
    slot_mapping = host_ints("slot_mapping", slot_mapping, ndim=1)
    num_reqs, num_tokens = query_lens.shape[0], slot_mapping.shape[0]
    padded_reqs = num_reqs if num_reqs_padded is None else count_arg(
        "num_reqs_padded", num_reqs_padded)
    padded_tokens = num_tokens if num_tokens_padded is None else count_arg(
        "num_tokens_padded", num_tokens_padded)
    check_extents(config, query_lens, seq_lens, slot_mapping, padded_reqs, padded_tokens)
    check_seq_lens(query_lens, seq_lens, config)
    check_slots(slot_mapping, slot_bound(config, num_kv_blocks, num_swa_kv_blocks))
    if require_decode_first:
        check_decode_first(query_lens, resolve_threshold(config, decode_threshold))
    longest = int(seq_lens.max()) if num_reqs else 0
    swa_blocks = num_kv_blocks if num_swa_kv_blocks is None else num_swa_kv_blocks
    for name, table, swa, blocks in (("block_table", block_table, False, num_kv_blocks),
                                     ("swa_block_table", swa_block_table, True, swa_blocks)):
        if table is None:
            continue
        table = host_ints(name, table, ndim=2)
        if table.shape[0] < num_reqs:
            raise InvalidBatchError(
                f"{name} has {table.shape[0]} rows but the step has {num_reqs} requests"
            )
        per_block = tokens_per_block(config, swa=swa)
        check_table_width(name, table.shape[1], longest, per_block)
        check_block_ids(name, table[:num_reqs], seq_lens, per_block, blocks)


#: The reductions the screens below still make as ufunc calls (``arr.min()`` goes through a
#: Python wrapper that costs more per call, and they run on every step). An
#: integer array's extreme is ``a.item(a.argmax())``: argmax is a plain array method, where
#: a ufunc reduction parses its keywords and sets up an iterator first, which dominates on
#: a step's small arrays (exact: the first index of the extreme).
_min, _sum = np.minimum.reduce, np.add.reduce
#: Without a pool size, slots still have to fit the staging's int64: an unsigned slot past
#: it would be staged as a negative one.
_INT64_END = 1 << 63


def _slot_limit(slots: np.ndarray, slot_bound: int | None) -> int | None:
    """What every slot must stay below: the pool's slot count, else the end of int64 for
    unsigned slots, else nothing (signed slots fit)."""
    if slot_bound is not None:
        return slot_bound
    return None if slots.dtype.kind == "i" else _INT64_END


def uniform_decode_passes(
    num_reqs: int, seq_lens: np.ndarray, slot_mapping: np.ndarray, config: ArenaConfig,
    slot_bound: int | None = None,
) -> bool:
    """A cheap pre-screen for the replay path: True only if :func:`validate_host_step`
    would accept a step of ``num_reqs`` requests that all schedule ``next_n`` tokens
    (query lengths the caller has already checked), without block tables, with the pool's
    slot count ``slot_bound`` (:func:`~staticattn.validation.values.slot_bound`; None:
    slots only ``>= -1``).

    False does not mean invalid: call :func:`validate_host_step` for the verdict and the
    error message; a fraction of the full check's cost.
    Host ints: ``seq_lens`` ``(num_reqs,)``, ``slot_mapping`` ``(num_reqs * next_n,)``.
    """
    n = config.next_n
    if not (
        isinstance(seq_lens, np.ndarray) and isinstance(slot_mapping, np.ndarray)
        and seq_lens.ndim == 1 and slot_mapping.ndim == 1
        and seq_lens.dtype.kind in "iu" and slot_mapping.dtype.kind in "iu"
        and 0 < num_reqs == seq_lens.shape[0] <= config.max_num_seqs
        and slot_mapping.shape[0] == num_reqs * n <= config.max_num_batched_tokens
    ):
        return False
    limit = _slot_limit(slot_mapping, slot_bound)
    return bool(
        seq_lens.item(seq_lens.argmin()) >= n
        and seq_lens.item(seq_lens.argmax()) <= config.max_model_len
        and slots_within(slot_mapping, limit)
    )


def screen_step(query_lens: np.ndarray, seq_lens: np.ndarray, slot_mapping: np.ndarray,
                config: ArenaConfig, slot_bound: int | None = None) -> tuple[int, int] | None:
    """A pre-screen for a step of any composition: ``(shortest, longest)`` query length
    only if :func:`validate_host_step` (decode-first order required at the config's
    ``decode_threshold``, no block tables, the pool's slot count ``slot_bound`` as in
    :func:`uniform_decode_passes`) would accept it, in a handful of vectorized passes; None
    otherwise.

    None does not mean invalid (it is also the answer for steps with an empty request):
    call :func:`validate_host_step` for the verdict and the error message. The two lengths
    are what picking the step's graph needs, so the caller does not reduce again. Host
    ints: ``query_lens``, ``seq_lens`` ``(num_reqs,)``, ``slot_mapping`` ``(num_tokens,)``.
    """
    q, s, slots = query_lens, seq_lens, slot_mapping
    if not (
        isinstance(q, np.ndarray) and isinstance(s, np.ndarray)
        and isinstance(slots, np.ndarray) and q.ndim == s.ndim == slots.ndim == 1
        and q.dtype.kind in "iu" and s.dtype.kind in "iu" and slots.dtype.kind in "iu"
        and 0 < q.shape[0] == s.shape[0] <= config.max_num_seqs
        and 0 < slots.shape[0] <= config.max_num_batched_tokens
    ):
        return None
    shortest, longest = q.item(q.argmin()), q.item(q.argmax())
    if shortest < 1:
        return None
    threshold = config.decode_threshold
    if longest > threshold:
        # Decode-first: the requests past the threshold are exactly the last ``count``.
        longer = q > threshold
        if _min(q[q.shape[0] - np.count_nonzero(longer):]) <= threshold:
            return None
    # ``q <= s`` as a comparison, not ``s - q >= 0``: a subtraction can wrap around.
    limit = _slot_limit(slots, slot_bound)
    if (_sum(q) == slots.shape[0] and _min(q <= s)
            and s.item(s.argmax()) <= config.max_model_len
            and slots_within(slots, limit)):
        return shortest, longest
    return None
