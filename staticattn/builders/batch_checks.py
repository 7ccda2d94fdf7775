"""Batch validation: every defect gets a typed error before anything is written.

Two entry points share one implementation of each check
(:mod:`staticattn.validation.values`):

* :func:`validate` (here) for a :class:`~staticattn.builders.batch.Batch` (tensors + static
  ints);
* :func:`~staticattn.validation.host_arrays.validate_host_step` for the plain host arrays an
  engine stages (what the graph manager checks before
  :meth:`~staticattn.staging.StepInputs.stage` writes anything).

Host-side values are read from host memory only (``query_start_loc_cpu``, ``seq_lens_cpu``,
or the numpy arrays themselves). Values that live on the device (block ids, the device copies
of the lengths, the slot mapping of a batch) are read only with ``check_device_values=True``:
that is a device->host copy, a host sync, meant for debugging, never for a captured step.

Each error message names the offending value and the limit, e.g.
``CapacityError: num_reqs=300 exceeds max_num_seqs=256``.
"""

from __future__ import annotations

import numpy as np
import torch

from staticattn.arena.buffers import PAD_SLOT_ID
from staticattn.arena.config import ArenaConfig
from staticattn.builders.batch import Batch
from staticattn.errors import CapacityError, InvalidBatchError
from staticattn.validation.values import (
    check_block_ids,
    check_capacity,
    check_decode_first,
    check_maximum,
    check_query_start_loc,
    check_seq_lens,
    check_slots,
    check_table_width,
    count_arg,
    resolve_threshold,
    slot_bound,
    tokens_per_block,
)

__all__ = ["validate"]


def validate(
    batch: Batch,
    config: ArenaConfig,
    *,
    require_decode_first: bool = False,
    decode_threshold: int | None = None,
    num_kv_blocks: int | None = None,
    num_swa_kv_blocks: int | None = None,
    check_device_values: bool = False,
) -> None:
    """Check a batch against a config; raise before anything is written.

    Parameters
    ----------
    batch : Batch
        Expected fields (``R = num_reqs``, ``T = num_actual_tokens``, device = the config's):
        ``query_start_loc`` int32 device ``(R + 1,)``, ``query_start_loc_cpu`` int32 host
        ``(R + 1,)``, ``seq_lens`` int32 device ``(R,)``, ``seq_lens_cpu`` int32 host ``(R,)``,
        ``block_table`` int32 device ``(R, C)``, ``slot_mapping`` int64 device ``(T,)``,
        optional ``positions`` int64 device ``(T,)``, ``token_to_req`` int32 device ``(T,)``,
        ``swa_block_table`` int32 device ``(R, C_swa)`` (required when the config has SWA),
        ``dcp_local_seq_lens`` int32 device ``(R,)``, ``is_prefilling`` bool host ``(R,)``.
    config : ArenaConfig
        The capacities the batch must fit.
    require_decode_first : bool
        Also check that no decode (``0 < q <= decode_threshold``) follows a longer request;
        zero-length rows are graph padding and may sit anywhere.
    decode_threshold : int, optional
        Default ``config.decode_threshold`` (``next_n``).
    num_kv_blocks : int, optional
        Blocks in the main KV pool; block ids must lie in ``[0, num_kv_blocks)``. Checked
        only with ``check_device_values`` (the table lives on the device).
    num_swa_kv_blocks : int, optional
        Blocks in the SWA pool (default ``num_kv_blocks``).
    check_device_values : bool
        Debugging only: copy the block tables, device lengths and slot mapping to the host (a
        device->host sync) and check the block ids of every column a request uses, that the
        device lengths agree with their host copies and that padded tokens have slot -1.

    Raises
    ------
    CapacityError
        ``num_reqs > max_num_seqs``, ``num_actual_tokens > max_num_batched_tokens``, a
        sequence or ``max_seq_len`` over ``max_model_len``.
    InvalidBatchError
        Anything malformed: dtype/device/rank/shape of a field, ``query_start_loc_cpu`` not
        zero-based or decreasing, ``qsl[num_reqs] > num_actual_tokens``, negative lengths,
        a query longer than its sequence, maxima below the data, a block table narrower than
        ``cdiv(max_seq_len, block_size * dcp_world_size)`` columns (SWA table:
        ``swa_block_size``), decodes after prefills, block ids out of range.

    Examples
    --------
    >>> import torch
    >>> from staticattn.arena import ArenaConfig
    >>> cfg = ArenaConfig(device="cpu", max_num_seqs=4, max_model_len=64, block_size=16)
    >>> qsl = torch.tensor([0, 1, 4], dtype=torch.int32)
    >>> lens = torch.tensor([9, 3], dtype=torch.int32)
    >>> batch = Batch(qsl, qsl, lens, lens, 2, 4, 3, 9,
    ...               torch.zeros(2, 1, dtype=torch.int32), torch.zeros(4, dtype=torch.int64))
    >>> validate(batch, cfg)
    >>> batch.max_query_len = 2
    >>> validate(batch, cfg)
    Traceback (most recent call last):
    ...
    staticattn.errors.InvalidBatchError: max_query_len=2 is below the longest query (3, request 1)
    """
    num_reqs = count_arg("num_reqs", batch.num_reqs)
    num_tokens = count_arg("num_actual_tokens", batch.num_actual_tokens)
    max_query_len = count_arg("max_query_len", batch.max_query_len)
    max_seq_len = count_arg("max_seq_len", batch.max_seq_len)
    check_capacity(num_reqs, num_tokens, config)
    if max_seq_len > config.max_model_len:
        raise CapacityError(
            f"max_seq_len={max_seq_len} exceeds max_model_len={config.max_model_len}"
        )
    _check_batch_tensors(batch, config, num_reqs, num_tokens)
    qsl = batch.query_start_loc_cpu.numpy().astype(np.int64)
    seq_lens = batch.seq_lens_cpu.numpy().astype(np.int64)
    check_query_start_loc(qsl, num_tokens)
    query_lens = np.diff(qsl)
    check_seq_lens(query_lens, seq_lens, config)
    check_maximum("max_query_len", max_query_len, query_lens, "query")
    check_maximum("max_seq_len", max_seq_len, seq_lens, "sequence")
    # Kernels may walk cdiv(max_seq_len, block) columns, so the declared maximum (already
    # known to be >= every host length) sizes the tables, not just the data.
    check_table_width("block_table", batch.block_table.shape[1], max_seq_len,
                       tokens_per_block(config, swa=False))
    if batch.swa_block_table is not None:
        check_table_width("swa_block_table", batch.swa_block_table.shape[1], max_seq_len,
                           tokens_per_block(config, swa=True))
    if require_decode_first:
        check_decode_first(query_lens, resolve_threshold(config, decode_threshold))
    if check_device_values:
        _check_device_values(batch, config, qsl, seq_lens, num_kv_blocks,
                             num_kv_blocks if num_swa_kv_blocks is None else num_swa_kv_blocks)


def _check_batch_tensors(batch: Batch, config: ArenaConfig, num_reqs: int, num_tokens: int
                         ) -> None:
    dev, host = config.torch_device, torch.device("cpu")
    i32, i64 = torch.int32, torch.int64
    fields: list[tuple[str, torch.Tensor | None, torch.dtype, torch.device,
                       tuple[int | None, ...], bool]] = [
        ("query_start_loc", batch.query_start_loc, i32, dev, (num_reqs + 1,), True),
        ("query_start_loc_cpu", batch.query_start_loc_cpu, i32, host, (num_reqs + 1,), True),
        ("seq_lens", batch.seq_lens, i32, dev, (num_reqs,), True),
        ("seq_lens_cpu", batch.seq_lens_cpu, i32, host, (num_reqs,), True),
        ("block_table", batch.block_table, i32, dev, (num_reqs, None), True),
        ("slot_mapping", batch.slot_mapping, i64, dev, (num_tokens,), True),
        ("positions", batch.positions, i64, dev, (num_tokens,), False),
        ("token_to_req", batch.token_to_req, i32, dev, (num_tokens,), False),
        ("swa_block_table", batch.swa_block_table, i32, dev, (num_reqs, None),
         config.has_swa),
        ("dcp_local_seq_lens", batch.dcp_local_seq_lens, i32, dev, (num_reqs,), False),
        ("is_prefilling", batch.is_prefilling, torch.bool, host, (num_reqs,), False),
    ]
    for name, tensor, dtype, device, shape, required in fields:
        if tensor is None:
            if required:
                raise InvalidBatchError(
                    f"{name} is missing"
                    + (" (the config has sliding_window set)" if name.startswith("swa") else "")
                )
            continue
        _check_tensor(name, tensor, dtype, device, shape)


def _check_tensor(name: str, tensor: object, dtype: torch.dtype, device: torch.device,
                  shape: tuple[int | None, ...]) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise InvalidBatchError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype != dtype:
        raise InvalidBatchError(f"{name} has dtype {tensor.dtype}; it must be {dtype}")
    if not _same_device(tensor.device, device):
        where = "the host" if device.type == "cpu" and name.endswith("_cpu") else str(device)
        raise InvalidBatchError(f"{name} is on {tensor.device}; it must be on {where}")
    if tensor.dim() != len(shape):
        raise InvalidBatchError(
            f"{name} has {tensor.dim()} dimensions (shape {tuple(tensor.shape)}); it must have "
            f"{len(shape)}"
        )
    for axis, (got, want) in enumerate(zip(tensor.shape, shape, strict=True)):
        if want is not None and got != want:
            expected = tuple("*" if s is None else s for s in shape)
            raise InvalidBatchError(
                f"{name} has shape {tuple(tensor.shape)}; expected {expected} "
                f"(axis {axis}: {got} != {want})"
            )


def _same_device(got: torch.device, want: torch.device) -> bool:
    if got.type != want.type:
        return False
    return got.index is None or want.index is None or got.index == want.index


def _check_device_values(
    batch: Batch, config: ArenaConfig, qsl: np.ndarray, seq_lens: np.ndarray,
    num_kv_blocks: int | None, num_swa_kv_blocks: int | None,
) -> None:
    # Every .cpu() below waits for the device: the debugging sync the caller opted into.
    dev_qsl = batch.query_start_loc.cpu().numpy()
    if not np.array_equal(dev_qsl, qsl):
        b = int(np.argmax(dev_qsl != qsl))
        raise InvalidBatchError(
            f"query_start_loc[{b}]={int(dev_qsl[b])} on the device differs from its host copy "
            f"query_start_loc_cpu[{b}]={int(qsl[b])}"
        )
    dev_lens = batch.seq_lens.cpu().numpy()
    over = (dev_lens > seq_lens) | (dev_lens < 0)
    if over.any():
        b = int(np.argmax(over))
        raise InvalidBatchError(
            f"seq_lens[{b}]={int(dev_lens[b])} on the device is outside [0, seq_lens_cpu[{b}]="
            f"{int(seq_lens[b])}] (the host copy is an upper bound)"
        )
    check_block_ids("block_table", batch.block_table.cpu().numpy(), seq_lens,
                     tokens_per_block(config, swa=False), num_kv_blocks)
    if batch.swa_block_table is not None:
        check_block_ids("swa_block_table", batch.swa_block_table.cpu().numpy(), seq_lens,
                         tokens_per_block(config, swa=True), num_swa_kv_blocks)
    slots = batch.slot_mapping.cpu().numpy()
    check_slots(slots, slot_bound(config, num_kv_blocks, num_swa_kv_blocks))
    padded = slots[int(qsl[-1]):]
    if padded.size and (padded != PAD_SLOT_ID).any():
        t = int(qsl[-1]) + int(np.argmax(padded != PAD_SLOT_ID))
        raise InvalidBatchError(
            f"slot_mapping[{t}]={int(slots[t])} belongs to a padded token (past "
            f"query_start_loc_cpu[num_reqs]={int(qsl[-1])}); padded tokens must be {PAD_SLOT_ID}"
        )
