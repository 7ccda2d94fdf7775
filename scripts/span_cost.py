"""What image spans cost a mixed step, measured in one process with interleaved rounds (host
timings drift between runs and machines: compare only within a run).

The reference mixed batch (``staticattn.bench.mixed_steps.reference_mixed_batch``) replayed through
its token bucket on three managers of one process: DeepSeek V4 (today's mixed rows), the
vision preset without spans, and the vision preset with three images
(``staticattn.bench.mixed_steps.IMAGE_SPANS``). Rounds alternate the three so drift hits each
alike; per path the host time of ``run()``, the GPU time of the replay and the host time of
the in-place step (``begin_step()`` + ``launch(k, t)``, checks on, the spans in the block),
medians with min and max over every round. Then the spans' own host work timed alone: their
check and their staging.

    python scripts/span_cost.py --rounds 10 --reps 50 --json span_cost.json
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from staticattn.arena import ArenaConfig
from staticattn.bench.mixed_steps import IMAGE_SPANS, reference_mixed_batch
from staticattn.bench.random_batches import NUM_KV_BLOCKS
from staticattn.bench.replay import in_place_host_us, step_times_us
from staticattn.builders import default_builders, make_arena
from staticattn.graphs import GraphManager, GraphOptions
from staticattn.validation.image_spans import check_image_spans


def mixed_manager(preset: str, seed: int = 0):
    """A manager of ``preset`` holding the 8192-token bucket, and the reference mixed batch's
    host ``(query_lens, seq_lens, slot_mapping)`` (int arrays)."""
    cfg = ArenaConfig.preset(preset)
    builders = default_builders(cfg)
    arena, inputs = make_arena(cfg, builders)
    gm = GraphManager(arena, inputs, builders, lambda batch, md: None,
                      GraphOptions(progress=False, num_kv_blocks=NUM_KV_BLOCKS))
    gm.capture([], buckets=[8192])
    step = reference_mixed_batch(inputs, np.random.default_rng(seed))
    return gm, tuple(np.asarray(x) for x in (step.query_lens, step.seq_lens,
                                             step.slot_mapping))


def _in_place_us(gm: GraphManager, args, spans, reps: int) -> list:
    """Host µs of the in-place step (``begin_step()`` + ``launch(k, t)``, the manager's
    checks on), the engine writing ``spans`` (None: none) into the block and launching with
    their count."""
    q, s, slots = args
    return in_place_host_us(gm, np.asarray(s), np.asarray(slots), reps, np.asarray(q),
                            image_spans=spans)


def _spans_host_us(gm: GraphManager, q: np.ndarray, s: np.ndarray, reps: int) -> list:
    """Median, min and max host µs of checking :data:`IMAGE_SPANS` against the step and
    writing them into the staging block (a graph manager's host work for spans)."""
    images = gm.inputs.images
    torch.cuda.synchronize()  # no replay reads the staging block any more
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        images.stage(check_image_spans(gm.config, IMAGE_SPANS, q, s))
        times.append((time.perf_counter() - t0) * 1e6)
    images.stage(None)
    t = np.asarray(times)
    return [float(np.median(t)), float(t.min()), float(t.max())]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    v4, v4_args = mixed_manager("deepseek-v4")
    vision, vision_args = mixed_manager("deepseek-v4-vision")
    # The in-place engine of the vision model counts its spans, none included (num_spans=0).
    paths = {"v4": (v4, v4_args, None, None),
             "vision, no spans": (vision, vision_args, None, ()),
             "vision, 3 images": (vision, vision_args, IMAGE_SPANS, IMAGE_SPANS)}
    times = {name: {"host": [], "gpu": [], "in_place": []} for name in paths}
    for gm, a, spans, _ in paths.values():  # warm every path
        for _ in range(5):
            assert gm.run(*a, image_spans=spans).mode == "graph"
    for _ in range(args.rounds):
        for name, (gm, a, spans, in_place_spans) in paths.items():
            host, gpu = step_times_us(gm, a, None, args.reps, image_spans=spans)
            times[name]["host"] += host
            times[name]["gpu"] += gpu
            times[name]["in_place"] += _in_place_us(gm, a, in_place_spans, args.reps)
    report = {"device": torch.cuda.get_device_name(), "rounds": args.rounds,
              "reps": args.reps, "paths": {}}
    base = float(np.median(times["v4"]["host"]))
    base_in_place = float(np.median(times["v4"]["in_place"]))
    for name, t in times.items():
        h, g, p = (np.asarray(t[k]) for k in ("host", "gpu", "in_place"))
        report["paths"][name] = {
            "in_place_host_us": [float(np.median(p)), float(p.min()), float(p.max())],
            "in_place_vs_v4": float(np.median(p)) / base_in_place,
            "host_us": [float(np.median(h)), float(h.min()), float(h.max())],
            "gpu_us": [float(np.median(g)), float(g.min()), float(g.max())],
            "host_vs_v4": float(np.median(h)) / base}
        print(f"{name:<18} run() host {np.median(h):6.1f} us (min {h.min():.1f}, max "
              f"{h.max():.1f}), x{np.median(h) / base:.2f} V4 | GPU {np.median(g):6.1f} us "
              f"(min {g.min():.1f}, max {g.max():.1f}) | in place {np.median(p):5.1f} us (min "
              f"{p.min():.1f}), x{np.median(p) / base_in_place:.2f}")
    # The share of the spans' own host work: their check and staging alone, same process.
    q, s = (np.asarray(x) for x in vision_args[:2])
    spans_us = _spans_host_us(vision, q, s, args.rounds * args.reps)
    report["span_check_and_staging_us"] = spans_us
    print(f"span check + staging alone: {spans_us[0]:.1f} us (min {spans_us[1]:.1f}, max "
          f"{spans_us[2]:.1f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    v4.close()
    vision.close()


if __name__ == "__main__":
    main()
