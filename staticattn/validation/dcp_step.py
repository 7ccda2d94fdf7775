"""Every rank of a decode-context-parallel group must be handed the same step.

Under DCP each rank stages the same global host inputs and localises them inside its own
graph; a rank handed a different step (another batch size, other lengths) would build
metadata of a different shape, and the first collective of the step would hang or mix
garbage. :func:`check_dcp_step` catches that on the host, before anything is staged: one
small all-gather of each rank's fingerprint of the step

``[dcp_world_size, dcp_rank, cp_kv_cache_interleave_size, num_reqs, num_tokens,
checksum(query_lens), checksum(seq_lens), checksum(the rest of the config)]`` (int64)

and a comparison on every rank: when every rank arrives, every rank raises the same typed
error, or none does. The all-gather waits at most ``timeout``: a rank that never arrives (it
failed earlier, or hangs) is a :class:`~staticattn.errors.RankMismatchError` on the others,
not a hang (a rank arriving after the others timed out may still pass: it had their
fingerprints). Use a gloo group: over NCCL the wait is not bounded on the host, and the
first collective of a lazily initialised NCCL group sets the communicator up inside the
call, beyond the timeout.

It costs one collective per call (tens of microseconds on NVLink, about a millisecond over
gloo): meant for the first steps, for debugging, or for engines that can afford it, outside
any captured graph.
"""

from __future__ import annotations

import dataclasses
import zlib
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from staticattn.arena.config import ArenaConfig
from staticattn.errors import ConfigError, InvalidBatchError, RankMismatchError
from staticattn.validation.values import host_ints

__all__ = ["FINGERPRINT_FIELDS", "check_dcp_step", "step_fingerprint"]

FINGERPRINT_FIELDS = ("dcp_world_size", "dcp_rank", "cp_kv_cache_interleave_size",
                      "num_reqs", "num_tokens", "query_lens_checksum", "seq_lens_checksum",
                      "config_checksum")

#: Config fields that may differ across the ranks of one group.
_PER_RANK_FIELDS = ("dcp_rank", "device")

#: A Mersenne prime: checksum terms stay below 2**62, their sum of up to 2**32 terms in int64.
_MODULUS = 2**31 - 1


def _checksum(values: np.ndarray) -> int:
    """An order-sensitive checksum of a host int array (a weighted sum modulo a prime):
    equal arrays agree; a changed, added or moved entry changes it but for a ~1/2**31 chance."""
    weights = (np.arange(values.size, dtype=np.int64) * 2654435761 + 97) % _MODULUS
    return int(((values % _MODULUS) * weights % _MODULUS).sum() % _MODULUS)


def step_fingerprint(config: ArenaConfig, query_lens, seq_lens) -> np.ndarray:
    """This rank's fingerprint of a step, int64 ``(len(FINGERPRINT_FIELDS),)``.

    Parameters
    ----------
    query_lens, seq_lens : int host arrays ``(num_reqs,)``
        The real requests' query and sequence lengths, as the engine stages them.
    """
    q = host_ints("query_lens", query_lens, ndim=1)
    s = host_ints("seq_lens", seq_lens, ndim=1)
    if q.size != s.size:
        raise InvalidBatchError(f"query_lens has {q.size} entries but seq_lens has {s.size}")
    # The fields the caller sets (derived ones repeat them, in reprs that vary per process).
    shared = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
              if f.init and f.name not in _PER_RANK_FIELDS}
    return np.array([config.dcp_world_size, config.dcp_rank,
                     config.cp_kv_cache_interleave_size, q.size, int(q.sum()), _checksum(q),
                     _checksum(s), zlib.crc32(repr(sorted(shared.items())).encode())],
                    dtype=np.int64)


def check_dcp_step(
    config: ArenaConfig,
    query_lens,
    seq_lens,
    *,
    group: dist.ProcessGroup | None = None,
    timeout: timedelta = timedelta(seconds=30),
) -> None:
    """Raise :class:`RankMismatchError` on every rank unless every rank of ``group`` was
    handed the same step and holds a consistent DCP config.

    Parameters
    ----------
    config : ArenaConfig
        This rank's config; nothing to check when ``dcp_world_size == 1``.
    query_lens, seq_lens : int host arrays ``(num_reqs,)``
        The step's real requests (host memory: reading device values would sync).
    group : ProcessGroup, optional
        The DCP group (default: the world); its size must be ``dcp_world_size`` and its
        rank ``i`` must hold ``dcp_rank = i``. Prefer a gloo group over the same ranks
        (``dist.new_group(ranks, backend="gloo")``) even when the step's collectives run
        on NCCL: the fingerprint lives on the host, and only a gloo wait holds the host to
        ``timeout`` (an NCCL wait returns at once and the read-back then waits for NCCL's
        own watchdog).
    timeout : timedelta
        How long to wait for the other ranks.

    Raises
    ------
    ConfigError
        torch.distributed is not initialised, or the group's size is not
        ``dcp_world_size``.
    RankMismatchError
        The ranks' fingerprints differ (which fields, on which ranks), or a rank did not
        answer within ``timeout``.
    """
    if config.dcp_world_size == 1:
        return
    if not dist.is_available() or not dist.is_initialized():
        raise ConfigError(
            f"dcp_world_size={config.dcp_world_size} needs torch.distributed initialised "
            "(torchrun, init_process_group) for the cross-rank step check"
        )
    world = dist.get_world_size(group)
    if world != config.dcp_world_size:
        raise ConfigError(
            f"the process group has {world} ranks, the config dcp_world_size="
            f"{config.dcp_world_size}"
        )
    # A copy that owns its memory: gloo's worker thread may drop the last reference to an
    # asynchronous collective's tensors, and a numpy-backed one needs the GIL to be freed.
    mine = torch.tensor(step_fingerprint(config, query_lens, seq_lens))
    if dist.get_backend(group) == "nccl":
        mine = mine.cuda()
    gathered = [torch.empty_like(mine) for _ in range(world)]
    work = dist.all_gather(gathered, mine, group=group, async_op=True)
    try:
        work.wait(timeout)
    except RuntimeError as exc:
        raise RankMismatchError(
            f"dcp_rank={config.dcp_rank}: not every rank of the DCP group answered the step "
            f"check within {timeout.total_seconds():g} s (a rank failed or hangs): {exc}"
        ) from None
    _compare([g.cpu().numpy() for g in gathered], config.dcp_rank)


def _compare(prints: list[np.ndarray], me: int) -> None:
    """The same verdict on every rank: every rank's fingerprint is in ``prints``."""
    problems = []
    for i, fp in enumerate(prints):
        if fp[1] != i:
            problems.append(f"group rank {i} holds dcp_rank={int(fp[1])}")
    for field, name in enumerate(FINGERPRINT_FIELDS):
        if name == "dcp_rank":
            continue
        values = [int(fp[field]) for fp in prints]
        if len(set(values)) > 1:
            problems.append(f"{name} differs across ranks: {values}")
    if problems:
        raise RankMismatchError(
            f"dcp_rank={me}: the DCP ranks were not handed the same step: "
            + "; ".join(problems)
        )
