"""One rank of a two-rank DCP launch in which rank 1 fails at step 3 (``test_dcp_faults.py``
starts it):

    torchrun --nproc-per-node 2 tests/distributed/dcp_fault_rank.py SCENARIO DEADLINE_S

* ``killed-at-check``: rank 1 kills itself (SIGKILL) before the step check;
* ``killed-in-step``: rank 1 passes the check, then kills itself before its run, leaving
  rank 0 in the step's collectives (NCCL: inside the replayed graph);
* ``stalled``: rank 1 sleeps twice the deadline before the check, then carries on.

Each rank runs the demo's step path: its arena, the indexer build and the DCP consumer
under a graph manager (graphs captured on a GPU, eager over gloo without), each step
through :func:`~staticattn.distributed.fence.fenced_step`. A typed error is reported as a
``FAULT {json}`` line (its type, the step, the seconds since the step began), then
:func:`~staticattn.distributed.world.abandon` ends the rank.

torchrun stops every worker as soon as one ends with an error, before the others could
report, so each worker runs its rank in a child process and reports how the child ended.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

FAULT_STEP, VICTIM, REQUESTS = 3, 1, 2


def report(**record) -> None:
    # One write of the whole line: the ranks share the pipe, and print() writes the text and
    # its newline separately when stdout is unbuffered (PYTHONUNBUFFERED), so another rank's
    # line could land between them. A write shorter than PIPE_BUF is not interleaved.
    sys.stdout.write("FAULT " + json.dumps(record) + "\n")
    sys.stdout.flush()


def run_rank(scenario: str, deadline_s: float) -> None:
    import numpy as np
    import torch.distributed as dist

    from staticattn.distributed.world import (
        dcp_config,
        dcp_world,
        graph_pool_blocks,
        join,
        random_decode_step,
        write_decode_step,
    )
    from staticattn.graphs import GraphManager, GraphOptions

    me = join(2, "faults", timedelta(seconds=deadline_s))
    cfg = dcp_config("deepseek-v4", 2, me.rank, me.device)
    arena, inputs, builders, consumer = dcp_world(cfg, dist.group.WORLD)
    options = GraphOptions(progress=False, num_kv_blocks=graph_pool_blocks(cfg))
    rng = np.random.default_rng(0)
    replays = 0
    with GraphManager(arena, inputs, builders, consumer, options) as gm:
        if me.cuda:
            gm.capture(sizes=[REQUESTS * cfg.next_n], buckets=())
        dist.barrier(group=me.check_group)
        for step in range(FAULT_STEP + 2):
            data = random_decode_step(cfg, rng, num_reqs=REQUESTS)
            write_decode_step(inputs, consumer, data)
            lengths = data["query_lens"], data["seq_lens"], data["slot_mapping"]
            fault = scenario if me.rank == VICTIM and step == FAULT_STEP else None
            if fault == "killed-at-check":
                os.kill(os.getpid(), signal.SIGKILL)
            if fault == "stalled":
                time.sleep(2 * deadline_s)
            replays = fenced_fault_step(me, cfg, lengths[:2], fault, step, replays,
                                        lambda lengths=lengths: gm.run(*lengths).mode == "graph")
    finish(me, step, replays)


def fenced_fault_step(me, config, arrays, fault: str | None, step: int, replays: int,
                      run) -> int:
    """One step through ``fenced_step(me, config, *arrays)``, killed inside it for the
    ``killed-in-step`` fault; ``run()`` is the step (1 when it replayed a graph). A typed
    error is reported and the rank abandoned; otherwise the replays so far."""
    from staticattn.distributed.fence import fenced_step
    from staticattn.distributed.world import abandon
    from staticattn.errors import RankFailureError

    began = time.monotonic()
    try:
        with fenced_step(me, config, *arrays):
            if fault == "killed-in-step":
                os.kill(os.getpid(), signal.SIGKILL)
            return replays + run()
    except RankFailureError as exc:
        report(rank=me.rank, error=type(exc).__name__, step=step, replays=replays,
               waited_s=time.monotonic() - began, cuda=me.cuda)
        abandon(me, exc)


def finish(me, step: int, replays: int) -> None:
    """Every step ran: say so and end (a peer failed unnoticed: the group is no longer
    whole to leave)."""
    report(rank=me.rank, error=None, step=step, replays=replays, cuda=me.cuda)
    os._exit(0)


def main(script: str, run) -> None:
    """The worker torchrun starts runs ``script`` again as its child, which runs
    ``run(scenario, deadline_s)``, and reports how the child ended."""
    if os.environ.get("FAULT_CHILD"):
        run(sys.argv[1], float(sys.argv[2]))
    else:
        child = subprocess.run([sys.executable, script, *sys.argv[1:]],
                               env={**os.environ, "FAULT_CHILD": "1"}, check=False)
        report(rank=int(os.environ["RANK"]), exit=child.returncode)


if __name__ == "__main__":
    main(__file__, run_rank)
