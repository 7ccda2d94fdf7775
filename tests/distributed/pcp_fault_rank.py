"""One rank of a two-rank PCP launch in which rank 1 fails at step 3 (``test_pcp_faults.py``
starts it):

    torchrun --nproc-per-node 2 tests/distributed/pcp_fault_rank.py SCENARIO DEADLINE_S

* ``killed-in-step``: rank 1 passes the step check, then kills itself before its run,
  leaving rank 0 in the step's all-gathers (NCCL: inside the replayed graph);
* ``stalled``: rank 1 sleeps twice the deadline before the check, then carries on.

Each rank runs the PCP demo's step path (:func:`~staticattn.distributed.pcp_world.
pcp_pair`, DeepSeek V3.2, each step through :func:`~staticattn.distributed.fence.
fenced_step`) and reports a typed error as ``dcp_fault_rank.py`` does, in a child process
of the worker torchrun started.
"""

from __future__ import annotations

import time
from datetime import timedelta

from dcp_fault_rank import FAULT_STEP, VICTIM, fenced_fault_step, finish, main


def run_rank(scenario: str, deadline_s: float) -> None:
    import numpy as np
    import torch.distributed as dist

    from staticattn.distributed.pcp_world import PCPFence, PCPSizes, pcp_pair, random_pcp_step
    from staticattn.distributed.world import join

    me = join(2, "faults", timedelta(seconds=deadline_s), flag="--pcp")
    sizes = PCPSizes(max_num_seqs=4, max_num_tokens=96, max_model_len=512)
    rng = np.random.default_rng(0)
    replays = 0
    with pcp_pair("deepseek-v3.2", 2, me.rank, None, me.device, sizes) as pair:
        fence = PCPFence(2, me.rank, 1, pair.rank.pcp, pair.rank.num_tokens,
                         sizes.max_num_tokens)
        if pair.rank.graphs:
            pair.rank.capture()
        dist.barrier(group=me.check_group)
        for step in range(FAULT_STEP + 2):
            data = random_pcp_step(rng, sizes, pair.columns)
            pair.write(data)
            fault = scenario if me.rank == VICTIM and step == FAULT_STEP else None
            if fault == "stalled":
                time.sleep(2 * deadline_s)
            replays = fenced_fault_step(me, fence, PCPFence.step_arrays(data), fault, step,
                                        replays, lambda data=data: (pair.run(data),
                                                                    pair.rank.graphs)[1])
    finish(me, step, replays)


if __name__ == "__main__":
    main(__file__, run_rank)
