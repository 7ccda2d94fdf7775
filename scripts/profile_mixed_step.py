"""Kernel time per replayed mixed step, per kernel name, for DeepSeek V4 and V4.1-Flash
(next_n 2): the reference mixed batch and five steps of the chunked-prefill trace of
``bench --mix``, each replayed 20 times under ``torch.profiler``. GPU only.

    python scripts/profile_mixed_step.py [--presets deepseek-v4 deepseek-v4.1-flash]
"""

from __future__ import annotations

import argparse
import collections

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from staticattn.arena import ArenaConfig
from staticattn.bench.mixed_steps import chunked_prefill_trace, reference_mixed_batch
from staticattn.bench.random_batches import NUM_KV_BLOCKS
from staticattn.builders import default_builders
from staticattn.builders.contract import make_arena
from staticattn.graphs.manager import GraphManager
from staticattn.graphs.options import GraphOptions

REPS = 20


def kernel_times(gm: GraphManager, steps) -> tuple[dict[str, list[float]], int]:
    """``{kernel name: [µs summed, launches]}`` over ``REPS`` replays of ``steps``."""
    for step in steps:
        for _ in range(3):  # warm
            gm.run(step.query_lens, step.seq_lens, step.slot_mapping)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPS):
            for step in steps:
                gm.run(step.query_lens, step.seq_lens, step.slot_mapping)
        torch.cuda.synchronize()
    times: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.name][0] += event.device_time_total
            times[event.name][1] += 1
    return times, REPS * len(steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=["deepseek-v4", "deepseek-v4.1-flash"])
    args = parser.parse_args()
    for preset in args.presets:
        cfg = ArenaConfig.preset(preset, num_speculative_tokens=1)
        builders = default_builders(cfg)
        arena, inputs = make_arena(cfg, builders)
        rng = np.random.default_rng(0)
        options = GraphOptions(progress=False, num_kv_blocks=NUM_KV_BLOCKS)
        with GraphManager(arena, inputs, builders, lambda batch, md: None, options) as gm:
            gm.capture()
            for scenario, steps in (("reference mixed batch", [reference_mixed_batch(inputs, rng)]),
                                    ("chunked-prefill trace",
                                     chunked_prefill_trace(inputs, rng, steps=5))):
                times, n = kernel_times(gm, steps)
                total = sum(t for t, _ in times.values()) / n
                launches = sum(c for _, c in times.values()) / n
                print(f"== {preset} {scenario}: {total:.1f} us kernel time per step, "
                      f"{launches:.1f} kernels")
                for name, (t, c) in sorted(times.items(), key=lambda kv: -kv[1][0]):
                    print(f"  {t / n:8.2f} us  x{c / n:5.1f}  {name[:100]}")


if __name__ == "__main__":
    main()
