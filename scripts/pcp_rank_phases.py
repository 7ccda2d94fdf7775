"""What a prefill-context-parallel rank's graph costs, phase by phase, on one GPU.

    python scripts/pcp_rank_phases.py --world 2 --dcp 2 --preset deepseek-v3.2 [--json out.json]

Rank 0 of a ``world``-rank PCP run (``dcp``: 1 or ``world``) joins a fake process group
(its collectives launch nothing), draws a 4-request step of the demo's sizes and captures
each phase of its graph body alone: the split (:func:`~staticattn.builders.pcp.rank_step.
build_rank_step`), each builder's mixed build, the emulated layer, and the whole body. Per
phase: the graph's nodes by type and the median GPU time of 100 replays; then the one-GPU
arena's mixed graph of the same step, its kernel nodes and GPU time. The collectives'
own cost is what ``bench --pcp`` measures on real ranks; this shows what the rest costs.
Without CUDA every phase runs once, eagerly, and nothing is timed.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--dcp", type=int, default=1)
    parser.add_argument("--preset", default="deepseek-v3.2")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=args.world)
    try:
        return _phases(args)
    finally:
        dist.destroy_process_group()


def _phases(args) -> dict:
    from staticattn.bench.floor import replay_gpu_times_us
    from staticattn.bench.replay import step_times_us
    from staticattn.builders.batch import Batch
    from staticattn.builders.pcp.rank_step import build_rank_step
    from staticattn.distributed.pcp_world import PCPSizes, pcp_pair, random_pcp_step
    from staticattn.graphs.capturer import capture, warm_up
    from staticattn.graphs.introspect import node_census

    cuda = torch.cuda.is_available()
    device = "cuda:0" if cuda else "cpu"
    sizes = PCPSizes()
    result = {"world": args.world, "dcp": args.dcp, "preset": args.preset,
              "device": torch.cuda.get_device_name() if cuda else "cpu", "phases": {}}

    def phase(name, fn) -> None:
        if not cuda:
            fn()
            result["phases"][name] = None
            return
        stream = torch.cuda.Stream()
        warm_up(fn, stream)
        graph, _ = capture(fn, stream)
        result["phases"][name] = {"nodes": node_census(graph),
                                  "gpu_us": float(np.median(replay_gpu_times_us(graph, 100)))}

    with pcp_pair(args.preset, args.world, 0, None, device, sizes, dcp=args.dcp) as pair:
        step = random_pcp_step(np.random.default_rng(0), sizes, pair.columns, num_reqs=4)
        pair.write(step)
        me = pair.rank
        host = (step["query_lens"], step["is_prefilling"], step["num_computed"])
        me.check(*host)
        me.stage(*host, step["req_state_idx"])
        phase("split", lambda: build_rank_step(me.pcp, me.views, me.inputs, me.rank))
        batch = Batch.for_mixed_capture(me.inputs, me.pcp.max_rows, me.num_tokens)
        md = {b.name: b.build_mixed(batch) for b in me.builders}
        for b in me.builders:
            phase(f"build {b.name}", lambda b=b: b.build_mixed(batch))
        phase("layer", lambda: me.step(batch, md))
        phase("body", me.body)
        if cuda:
            pair.single.capture(sizes=(), buckets=(sizes.max_num_tokens,))
            nodes = [g.nodes for g in pair.single.mixed_graphs.values()]
            _, gpu = step_times_us(pair.single, pair.single_args(step), None, 100)
            result["one_gpu"] = {"nodes": nodes[0] if nodes else None,
                                 "gpu_us": float(np.median(gpu))}
    for name, fig in result["phases"].items():
        print(f"{name:>24}: " + ("ran (no CUDA)" if fig is None else
                                 f"{fig['nodes']}, {fig['gpu_us']:.1f} us GPU"))
    if "one_gpu" in result:
        print(f"{'one GPU, same step':>24}: {result['one_gpu']['nodes']}, "
              f"{result['one_gpu']['gpu_us']:.1f} us GPU")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
