"""Every rank of a decode-context-parallel group must be handed the same step.

Under DCP each rank stages the same global host inputs and localises them inside its own
graph; a rank handed a different step (another batch size, other lengths) would build
metadata of a different shape, and the first collective of the step would hang or mix
garbage. :func:`check_dcp_step` catches that on the host, before anything is staged: one
small all-gather of each rank's fingerprint of the step

``[dcp_world_size, dcp_rank, cp_kv_cache_interleave_size, num_reqs, num_tokens,
checksum(query_lens), checksum(seq_lens), checksum(the rest of the config)]`` (int64)

and a comparison on every rank: when every rank arrives, every rank raises the same typed
error, or none does. The all-gather waits at most ``timeout``, the group's step deadline: a
rank that never arrives (it died: its connections close, or it stalls) is a
:class:`~staticattn.errors.RankFailureError` (:class:`~staticattn.errors.RankTimeoutError`
when the wait ran out) on the others, not a hang. A rank arriving after the others gave up
would still see its all-gather complete (they had sent their fingerprints) and go on to
launch a step nobody else runs: with :class:`StepVerdicts` the first rank to settle a step
decides it for every rank, through a store they all reach, so the late rank raises the
others' error instead. Use a gloo group: over NCCL the wait is not bounded on the host, and
the first collective of a lazily initialised NCCL group sets the communicator up inside the
call, beyond the timeout.

It costs one collective per call (tens of microseconds on NVLink, about a millisecond over
gloo), and with verdicts two store requests: meant for the first steps, for debugging, or
for engines that can afford it, outside any captured graph. Run with verdicts at every step
it is what keeps a failed rank from hanging the others (``distributed.fence``).
"""

from __future__ import annotations

import dataclasses
import time
import zlib
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from staticattn.arena.config import ArenaConfig
from staticattn.errors import (
    ConfigError,
    InvalidBatchError,
    RankFailureError,
    RankMismatchError,
    RankTimeoutError,
)
from staticattn.validation.values import host_ints

__all__ = ["DEFAULT_DEADLINE", "FINGERPRINT_FIELDS", "StepVerdicts", "check_dcp_step",
           "step_fingerprint"]

#: How long a rank waits at a step for the others, unless told otherwise.
DEFAULT_DEADLINE = timedelta(seconds=30)

FINGERPRINT_FIELDS = ("dcp_world_size", "dcp_rank", "cp_kv_cache_interleave_size",
                      "num_reqs", "num_tokens", "query_lens_checksum", "seq_lens_checksum",
                      "config_checksum")

#: Config fields that may differ across the ranks of one group.
_PER_RANK_FIELDS = ("dcp_rank", "device")

#: A Mersenne prime: checksum terms stay below 2**62, their sum of up to 2**32 terms in int64.
_MODULUS = 2**31 - 1

#: A step every rank's fingerprint reached; a failed step's verdict says why, a missed
#: deadline's starting with ``_LATE``.
_OK, _LATE = "ok", "timed out:"


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


class StepVerdicts:
    """The group's verdict on each step check, one per step, shared through a store: the
    first rank to settle a step decides it for every rank.

    Each rank of the group makes one and hands it to :func:`check_dcp_step` at every step,
    the same steps in the same order (the verdicts are counted, not named). After a failed
    step the group is broken: no later step of it passes.

    Parameters
    ----------
    store : torch.distributed.Store
        Reachable by every rank and outliving each of them: the launch's own
        (``torchrun``'s agent hosts it; :func:`~staticattn.distributed.world.join` passes
        it on) or a ``FileStore``. One key a step, ``dcp_step/<n>``, dropped once the
        next step passes.
    """

    def __init__(self, store: dist.Store):
        self.store = store
        self.step = 0

    def settle(self, failure: str | None) -> str | None:
        """Propose this rank's outcome of the current step's exchange (None: every
        fingerprint arrived; else why not) and return the group's: None, or the first
        failure proposed."""
        key = f"dcp_step/{self.step}"
        self.step += 1
        try:
            verdict = self.store.compare_set(key, "", failure or _OK).decode()
            if verdict == _OK and self.step > 1:
                # Every rank settled the step before when its fingerprint left for this one.
                self.store.delete_key(f"dcp_step/{self.step - 2}")
        except RuntimeError as exc:
            return f"the store the ranks settle each step in is unreachable: {exc}"
        return None if verdict == _OK else verdict


def check_dcp_step(
    config: ArenaConfig,
    query_lens,
    seq_lens,
    *,
    group: dist.ProcessGroup | None = None,
    timeout: timedelta = DEFAULT_DEADLINE,
    verdicts: StepVerdicts | None = None,
) -> None:
    """Raise :class:`RankMismatchError` on every rank unless every rank of ``group`` was
    handed the same step and holds a consistent DCP config; a
    :class:`~staticattn.errors.RankFailureError` unless every rank reached it in time.

    Parameters
    ----------
    config : ArenaConfig
        This rank's config; nothing to check when ``dcp_world_size == 1``. A stand-in with
        the same fields may add ``group_kind`` (default ``"DCP"``): the messages name the
        group and its ranks by it (``"pcp_rank=1"``).
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
        The step deadline: how long to wait for the other ranks (default
        :data:`DEFAULT_DEADLINE`, 30 s).
    verdicts : StepVerdicts, optional
        This rank's verdicts of the group's steps. Without them a rank that arrives after
        the others gave up may pass; with them it raises their error.

    Raises
    ------
    ConfigError
        torch.distributed is not initialised, or the group's size is not
        ``dcp_world_size``.
    RankMismatchError
        The ranks' fingerprints differ (which fields, on which ranks).
    RankTimeoutError
        A rank did not answer within ``timeout``; or, with ``verdicts``, this rank arrived
        after the others gave up on the step.
    RankFailureError
        A rank failed during the check (its connection closed), or the store is
        unreachable.
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
    group_kind = getattr(config, "group_kind", "DCP")
    me = f"{group_kind.lower()}_rank={config.dcp_rank}"
    failure = _wait(work, timeout, me)
    if verdicts is not None:
        verdict = verdicts.settle(failure)
        if verdict is None and failure is not None:
            # The others had every fingerprint, so this rank's all-gather is finishing.
            verdict = _wait(work, timeout, me)
        failure = verdict
    if failure is not None:
        error = RankTimeoutError if failure.startswith(_LATE) else RankFailureError
        raise error(f"{me}: the {group_kind} group failed at the step check: {failure}")
    _compare([g.cpu().numpy() for g in gathered], me, group_kind)


def _wait(work, timeout: timedelta, me: str) -> str | None:
    """None once every rank's fingerprint is here, else why not (a verdict); ``me`` names
    this rank (``"dcp_rank=1"``)."""
    start = time.monotonic()
    try:
        work.wait(timeout)
        return None
    except RuntimeError as exc:
        if time.monotonic() - start < timeout.total_seconds():
            return f"{me} lost a rank during the step check (it failed): {exc}"
        return (f"{_LATE} {me} waited {timeout.total_seconds():g} s for every rank "
                f"to reach the step check (a rank failed or stalls): {exc}")


def _compare(prints: list[np.ndarray], me: str, group_kind: str) -> None:
    """The same verdict on every rank: every rank's fingerprint is in ``prints``."""
    problems = []
    for i, fp in enumerate(prints):
        if fp[1] != i:
            problems.append(f"group rank {i} holds {group_kind.lower()}_rank={int(fp[1])}")
    for field, name in enumerate(FINGERPRINT_FIELDS):
        if name == "dcp_rank":
            continue
        values = [int(fp[field]) for fp in prints]
        if len(set(values)) > 1:
            problems.append(f"{name} differs across ranks: {values}")
    if problems:
        raise RankMismatchError(
            f"{me}: the {group_kind} ranks were not handed the same step: "
            + "; ".join(problems)
        )
