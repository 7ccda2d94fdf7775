"""The checks every validation entry point shares: one implementation of each, raising a
typed error that names the offending value and the limit before anything is written.

Host arrays only (numpy); nothing here reads the device.
"""

from __future__ import annotations

import numpy as np
import torch

from staticattn.arena.buffers import PAD_SLOT_ID
from staticattn.arena.config import ArenaConfig, cdiv
from staticattn.errors import CapacityError, InvalidBatchError

__all__ = [
    "check_block_ids",
    "check_capacity",
    "check_decode_first",
    "check_maximum",
    "check_non_decreasing",
    "check_non_negative",
    "check_query_start_loc",
    "check_seq_lens",
    "check_slots",
    "check_table_width",
    "count_arg",
    "host_ints",
    "resolve_threshold",
    "slot_bound",
    "slots_within",
    "tokens_per_block",
]


def count_arg(name: str, value: object) -> int:
    """``value`` as a non-negative int; a bool, non-int or negative is a typed error."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidBatchError(f"{name} must be an int, got {value!r}")
    if value < 0:
        raise InvalidBatchError(f"{name}={value} is negative; it must be >= 0")
    return int(value)


def check_capacity(num_reqs: int, num_tokens: int, config: ArenaConfig) -> None:
    """Typed error when a step of ``num_reqs`` requests / ``num_tokens`` tokens does not fit
    the config's capacities."""
    if num_reqs > config.max_num_seqs:
        raise CapacityError(f"num_reqs={num_reqs} exceeds max_num_seqs={config.max_num_seqs}")
    if num_tokens > config.max_num_batched_tokens:
        raise CapacityError(
            f"num_tokens={num_tokens} exceeds max_num_batched_tokens="
            f"{config.max_num_batched_tokens}"
        )


def check_non_negative(name: str, values: np.ndarray) -> None:
    """Typed error naming the first negative entry of host ints ``values`` ``(n,)``."""
    if values.size and values.min() < 0:
        b = int(np.argmin(values))
        raise InvalidBatchError(f"{name}[{b}]={int(values[b])} is negative; it must be >= 0")


def check_non_decreasing(name: str, qsl: np.ndarray) -> np.ndarray:
    """Typed error where query start locations ``qsl`` (host ints ``(num_reqs + 1,)``)
    decrease; returns the query lengths ``np.diff(qsl)``, ``(num_reqs,)``."""
    steps = np.diff(qsl)
    if steps.size and steps.min() < 0:
        b = int(np.argmin(steps))
        raise InvalidBatchError(
            f"{name} decreases at request {b}: {int(qsl[b])} -> {int(qsl[b + 1])}; it must "
            "be non-decreasing"
        )
    return steps


def check_query_start_loc(qsl: np.ndarray, num_tokens: int) -> None:
    """Host query starts ``qsl`` int ``(num_reqs + 1,)``: from 0, non-decreasing, ending at
    ``num_tokens``; a typed error otherwise."""
    if qsl[0] != 0:
        raise InvalidBatchError(f"query_start_loc_cpu[0]={int(qsl[0])} must be 0")
    check_non_decreasing("query_start_loc_cpu", qsl)
    if qsl[-1] > num_tokens:
        raise InvalidBatchError(
            f"query_start_loc_cpu[num_reqs]={int(qsl[-1])} exceeds num_actual_tokens="
            f"{num_tokens} (padding may only add tokens, never drop them)"
        )


def check_seq_lens(query_lens: np.ndarray, seq_lens: np.ndarray, config: ArenaConfig) -> None:
    """Host ``seq_lens`` int ``(num_reqs,)``: non-negative, at most ``max_model_len``, and
    each at least its request's query length (``query_lens`` int ``(num_reqs,)``)."""
    check_non_negative("seq_lens", seq_lens)
    if seq_lens.size and seq_lens.max() > config.max_model_len:
        b = int(np.argmax(seq_lens))
        raise CapacityError(
            f"seq_lens[{b}]={int(seq_lens[b])} exceeds max_model_len={config.max_model_len}"
        )
    over = query_lens > seq_lens
    if over.any():
        b = int(np.argmax(over))
        raise InvalidBatchError(
            f"request {b} schedules {int(query_lens[b])} tokens, more than its sequence "
            f"length seq_lens[{b}]={int(seq_lens[b])}"
        )


def check_maximum(name: str, declared: int, values: np.ndarray, what: str) -> None:
    """Typed error when a declared maximum ``declared`` is below the largest of ``values``
    (host ints ``(n,)``; ``what`` names them in the message)."""
    if values.size and values.max() > declared:
        b = int(np.argmax(values))
        raise InvalidBatchError(
            f"{name}={declared} is below the longest {what} ({int(values[b])}, request {b})"
        )


def check_decode_first(query_lens: np.ndarray, threshold: int) -> None:
    """Decodes (query length ``<= threshold``) must lead the batch: a typed error naming the
    first decode behind a longer request (``query_lens`` host ints ``(num_reqs,)``)."""
    longer = query_lens > threshold
    if not longer.any():
        return
    first_long = int(np.argmax(longer))
    late = (query_lens[first_long:] > 0) & ~longer[first_long:]
    if late.any():
        b = first_long + int(np.argmax(late))
        raise InvalidBatchError(
            f"request {b} is a decode (query length {int(query_lens[b])} <= decode_threshold="
            f"{threshold}) but follows request {first_long} (query length "
            f"{int(query_lens[first_long])}); reorder the batch decode-first"
        )


def check_table_width(name: str, columns: int, longest: int, tokens_per_block: int) -> None:
    """A block table of ``columns`` columns must reach the longest sequence (``longest``
    tokens, ``tokens_per_block`` a column); a typed error otherwise."""
    needed = cdiv(longest, tokens_per_block)
    if columns < needed:
        raise InvalidBatchError(
            f"{name} has {columns} columns but a sequence of {longest} tokens needs "
            f"cdiv({longest}, {tokens_per_block}) = {needed}"
        )


def check_block_ids(
    name: str, table: np.ndarray, seq_lens: np.ndarray, tokens_per_block: int,
    num_blocks: int | None,
) -> None:
    """Every block id a request uses (``table`` int ``(num_reqs, columns)``, the columns its
    ``seq_lens`` reach at ``tokens_per_block`` tokens a column) is ``>= 0`` and below
    ``num_blocks`` when given; a typed error naming the first offender."""
    used = np.arange(table.shape[1])[None, :] < -(-seq_lens[:, None] // tokens_per_block)
    bad = used & (table < 0)
    if num_blocks is not None:
        bad |= used & (table >= num_blocks)
    if bad.any():
        b, c = np.unravel_index(int(np.argmax(bad)), bad.shape)
        limit = f"[0, {num_blocks})" if num_blocks is not None else ">= 0"
        raise InvalidBatchError(
            f"{name}[{b}, {c}]={int(table[b, c])} is out of range {limit} (column {c} is used "
            f"by request {b}, sequence length {int(seq_lens[b])})"
        )


def check_slots(slots: np.ndarray, bound: int | None) -> None:
    """Slots int64 ``(num_tokens,)``: ``>= -1`` (-1 = do not write) and below ``bound`` (the
    KV pool's slots, when known); a typed error naming the first offender."""
    if not slots.size:
        return
    if slots.min() < PAD_SLOT_ID:
        t = int(np.argmin(slots))
        raise InvalidBatchError(
            f"slot_mapping[{t}]={int(slots[t])} is below {PAD_SLOT_ID} (the do-not-write slot)"
        )
    if bound is not None and slots.max() >= bound:
        t = int(np.argmax(slots))
        raise InvalidBatchError(
            f"slot_mapping[{t}]={int(slots[t])} is out of range; the KV pool has {bound} slots"
        )


def slots_within(slots: np.ndarray, limit: int | None) -> bool:
    """Whether every slot of ``slots`` (host ints ``(num_tokens,)``, not empty) is ``>= -1``
    and below ``limit`` (None: no upper bound): the screens' yes/no form of
    :func:`check_slots`.
    Extremes through argmin / argmax, a third of a ufunc reduction's cost on a step's small
    arrays (see :mod:`staticattn.validation.host_arrays`)."""
    return (slots.item(slots.argmin()) >= PAD_SLOT_ID
            and (limit is None or slots.item(slots.argmax()) < limit))


def host_ints(name: str, values: object, *, ndim: int) -> np.ndarray:
    """``values`` as an int64 host array of rank ``ndim`` (``(n,)`` for 1); a device
    tensor is refused (reading it would sync), as are other ranks and non-integer dtypes."""
    if isinstance(values, torch.Tensor):
        if values.device.type != "cpu":
            raise InvalidBatchError(
                f"{name} is on {values.device}; pass the host copy (reading it would sync)"
            )
        values = values.numpy()
    arr = np.asarray(values)
    if arr.ndim != ndim:
        raise InvalidBatchError(f"{name} must be {ndim}-D, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise InvalidBatchError(f"{name} must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def tokens_per_block(config: ArenaConfig, *, swa: bool) -> int:
    """Tokens one block-table column spans: the SWA group is replicated under DCP, the main
    group's column spans a block on each of the ``dcp_world_size`` ranks."""
    if swa:
        return config.swa_block_size
    return config.block_size * config.dcp_world_size


def slot_bound(config: ArenaConfig, num_kv_blocks: int | None,
                num_swa_kv_blocks: int | None) -> int | None:
    """The slot mapping's exclusive upper bound: the KV pool's blocks times the block size of
    the group the slots address (the SWA group when the config has one), or None when the
    pool size is not given."""
    if config.has_swa:
        blocks = num_kv_blocks if num_swa_kv_blocks is None else num_swa_kv_blocks
        return None if blocks is None else blocks * config.swa_block_size
    return None if num_kv_blocks is None else num_kv_blocks * config.block_size


def resolve_threshold(config: ArenaConfig, decode_threshold: int | None) -> int:
    """The decode threshold to split with: the given one, else the config's (``next_n``)."""
    return config.decode_threshold if decode_threshold is None else int(decode_threshold)
