"""A step of a decode-context-parallel group that ends, on every rank, in its result or a
typed error within the group's deadline, never in a hang.

A rank that dies or stalls leaves the others waiting for its share of a collective; inside
a replayed graph nothing on the host notices, and NCCL's watchdog times only the
collectives issued eagerly. :func:`fenced_step` bounds each wait by the rank's
``deadline`` (:func:`~staticattn.distributed.world.join`, default 30 s):

1. the step check (:func:`~staticattn.validation.dcp_step.check_dcp_step`, over gloo, with
   the group's :class:`~staticattn.validation.dcp_step.StepVerdicts`): every rank must
   reach it within the deadline, else a
   :class:`~staticattn.errors.RankTimeoutError` on each one that did, before anything is
   staged; a rank that arrives later raises it too, at once, launching nothing; a rank
   that died is a :class:`~staticattn.errors.RankFailureError` at once (its connection
   closes);
2. the step itself (the body): a collective that fails on the host (gloo: a peer's
   connection closed) is a :class:`~staticattn.errors.RankFailureError`;
3. on a GPU, the end of the step on the device, polled for at most the deadline after the
   launch; past it the group's NCCL communicators are aborted (their kernels stop waiting)
   and the rank raises :class:`~staticattn.errors.RankTimeoutError`.

So a rank that dies or stalls before the check is a typed error on every other rank within
one deadline, and one that fails mid-step within two deadlines of the others' launch (one
waiting for the device, at most one more for the abort, which may wait on the lost peer). After
any of them the group is broken: :func:`~staticattn.distributed.world.abandon` ends the
process. Under gloo (no CUDA) a stalled rank mid-step holds the others in the collective
for the group's timeout (120 s), not the deadline.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist

from staticattn.distributed.world import Rank
from staticattn.errors import RankFailureError, RankTimeoutError, StaticAttnError
from staticattn.validation.dcp_step import check_dcp_step

__all__ = ["fenced_step"]


@contextlib.contextmanager
def fenced_step(me: Rank, config, query_lens, seq_lens) -> Iterator[None]:
    """Check the step against the group, run the body (the step: ``GraphManager.run``), and
    wait for the device to finish it, each bounded by ``me.deadline``.

    Parameters
    ----------
    me : Rank
        This rank (:func:`~staticattn.distributed.world.join`).
    config : ArenaConfig
        This rank's config.
    query_lens, seq_lens : int host arrays ``(num_reqs,)``
        The step's real requests, as the body runs them.

    Raises
    ------
    RankTimeoutError
        A rank missed the deadline (at the check or mid-step), this one included.
    RankFailureError
        A rank died, or the step failed mid-way on this rank.
    RankMismatchError
        The ranks were handed different steps.
    """
    check_dcp_step(config, query_lens, seq_lens, group=me.check_group, timeout=me.deadline,
                   verdicts=me.verdicts)
    launched = time.monotonic()
    try:
        yield
        if me.cuda:
            _wait_for_device(me, launched)
    except StaticAttnError:
        raise
    except RuntimeError as exc:
        raise RankFailureError(f"rank {me.rank}: the step failed mid-way (a rank of the "
                               f"group failed): {exc}") from exc


def _wait_for_device(me: Rank, launched: float) -> None:
    """Return once the device has finished the step; past the deadline, abort the group's
    communicators and raise :class:`RankTimeoutError`."""
    done = torch.cuda.Event()
    done.record()
    seconds = me.deadline.total_seconds()
    while not done.query():
        if time.monotonic() - launched > seconds:
            # ncclCommAbort sets the flag NCCL's kernels poll while they wait for a peer, so
            # the replayed graph ends; the abort itself may wait on the lost peer, hence a
            # thread given at most one more deadline.
            abort = threading.Thread(target=dist.group.WORLD.abort, daemon=True)
            abort.start()
            abort.join(seconds)
            raise RankTimeoutError(
                f"rank {me.rank}: the step's collectives did not finish within "
                f"{seconds:g} s of its launch (a rank failed or stalls mid-step); the "
                "group's NCCL communicators are aborted")
        time.sleep(1e-4)
