"""How a captured step should get its small host inputs: measured, both ways.

(a) the staging kernel reading pinned host memory directly (what staticattn does), and
(b) host->device copy nodes of the same staging views (one per vector) in the graph.
GPU time per replay (CUDA events, median of many) for a few uniform decode sizes.

    python scripts/staging_choice.py
"""

from __future__ import annotations

import numpy as np
import torch

from staticattn.arena import ArenaConfig
from staticattn.bench.floor import replay_gpu_us
from staticattn.builders import make_arena
from staticattn.graphs.capturer import capture, warm_up


def replay_us(fn, reps: int = 500) -> float:
    """Median GPU time of replaying a graph of ``fn`` (warmed up and captured first)."""
    stream = torch.cuda.Stream()
    warm_up(fn, stream)
    graph, _ = capture(fn, stream)
    return replay_gpu_us(graph, reps).median


def main() -> None:
    cfg = ArenaConfig.deepseek_v4()
    _, inputs = make_arena(cfg)
    n = cfg.next_n
    print(f"{torch.cuda.get_device_name()}: GPU us per replay (median)")
    print(f"{'requests':>8} {'staging kernel':>15} {'memcpy nodes':>13}")
    for reqs in (1, 32, 256):
        tokens = reqs * n
        inputs.stage(np.full(reqs, n), np.full(reqs, 1000), np.arange(tokens))

        def kernel(reqs=reqs, tokens=tokens):
            inputs.copy_to_device(reqs, tokens, uniform=True)

        def copies(reqs=reqs, tokens=tokens):
            inputs.query_start_loc[: reqs + 1].copy_(inputs.host_query_start_loc[: reqs + 1],
                                                     non_blocking=True)
            inputs.seq_lens[:reqs].copy_(inputs.host_seq_lens[:reqs], non_blocking=True)
            inputs.slot_mapping[:tokens].copy_(inputs.host_slot_mapping[:tokens],
                                               non_blocking=True)

        print(f"{reqs:>8} {replay_us(kernel):>15.1f} {replay_us(copies):>13.1f}")


if __name__ == "__main__":
    main()
