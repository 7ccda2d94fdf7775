"""A short capture + replay loop for compute-sanitizer (memcheck, racecheck) over every graph
kind of every preset:

    compute-sanitizer --tool memcheck python scripts/sanitize_loop.py
    compute-sanitizer --tool racecheck python scripts/sanitize_loop.py --preset deepseek-v4.1-flash

Per case (a preset and its draft tokens: DeepSeek V3.2, V4 with native MTP, next_n 2, and
the flatten path, next_n 3, V4.1-Flash, V4's vision variant), the soak's world
(``scripts/soak.py``: the preset's default builders, with the decoder-replay builder on
V4.1, and :class:`soak.SoakStep`) at small capacities so the sanitizer finishes quickly:
decode graphs, token buckets through ``run()`` and in place, graphs of device-decided
lengths, context buckets and, on V4.1, the DSpark draft step's decode graphs; V4.1's steps
with prefills carry replay starts, the vision preset's image spans (counts drawn anew each
step). Each kind's first step is also run through the eager reference builds and compared;
then the eager graph builds of steps no graph holds (noted, recorded, then launched from
the record). Every graph kind must have replayed. ``--device cpu``: the same loop with the
graphs emulated (a smoke test).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch
from soak import (
    capture,
    differing,
    draw_step,
    eager_reference,
    kinds_of,
    lengths_differ,
    replay,
    soak_world,
)

from staticattn.arena import ArenaConfig
from staticattn.graphs import EagerBuild, GraphKind

POOL = 512
#: (preset, draft tokens) of each case.
CASES = [("deepseek-v3.2", 0), ("deepseek-v4", 1), ("deepseek-v4", 2),
         ("deepseek-v4.1-flash", 1), ("deepseek-v4-vision", 1)]
SMALL = dict(max_num_seqs=16, max_num_batched_tokens=256, max_model_len=8192)
#: The vision preset's image capacities at this size.
VISION = dict(max_image_tokens=64, max_image_spans=8)


def one_case(preset: str, drafts: int, device: str, rounds: int) -> bool:
    extra = VISION if preset == "deepseek-v4-vision" else {}
    cfg = ArenaConfig.preset(preset, **SMALL, **extra, num_speculative_tokens=drafts,
                             device=device)
    rng = np.random.default_rng(0)
    n = cfg.next_n
    world = soak_world(cfg, rng, POOL, contexts=[1024, 8192])
    kinds, bad, span_counts, starts = kinds_of(cfg), [], [], 0
    try:
        capture(world, [n, 4 * n, 16 * n], [64, 256])
        for i in range(rounds):
            for kind in kinds:
                d = draw_step(world, kind, rng, 16, [40, 200])
                out, graphed = replay(world, d)
                starts += d.replay_start is not None and bool(d.replay_start.any())
                span_counts += [] if d.spans is None else [d.spans.shape[0]]
                if not graphed or lengths_differ(world, d, out):
                    bad.append(f"{kind}: {'lengths differ' if graphed else 'ran eagerly'}")
                if i == 0:
                    nt = int(d.q.sum())
                    got = out[:nt].clone() if kind == "draft" else tuple(o[:nt].clone()
                                                                         for o in out)
                    bad += [f"{kind}: {c} differs from the eager reference"
                            for c in differing(world, got, eager_reference(world, d))]
        # The graph builds run eagerly (what a step no graph holds runs), three times per
        # step: the launches of a decode step and of a mixed step are noted, recorded,
        # then launched from the record.
        steps = [draw_step(world, "decode", rng, 3, [40]), draw_step(world, "mixed", rng, 16,
                                                                    [200])]
        for _ in range(3):
            for d in steps:
                spans = None if d.spans is None else d.spans.tolist()
                world.gm.run(d.q, d.s, d.slots, replay_start=d.replay_start,
                             image_spans=spans, eager=EagerBuild.GRAPH)
        if device == "cuda":
            torch.cuda.synchronize()
        gm, stats = world.gm, world.gm.stats
        replayed = {"decode": stats.replays[GraphKind.DECODE],
                    "mixed": stats.replays[GraphKind.MIXED],
                    "device": stats.replays[GraphKind.DEVICE_LENGTHS],
                    "context": world.cg.stats.replays[GraphKind.DECODE]}
        if world.draft is not None:
            replayed["draft"] = world.draft.stats.replays[GraphKind.DECODE]
        bad += [f"{kind} never replayed" for kind, count in replayed.items() if not count]
        bad += ["no replay start drawn"] if cfg.bounded_replay and not starts else []
        bad += ["no falling span count"] if cfg.image_spans and not any(
            b < a for a, b in zip(span_counts, span_counts[1:])) else []
        recorded = gm.eager.recorded_launches
        print(f"{preset} next_n {n}: replays {replayed}, eager {dict(stats.eager)}, "
              f"kinds {'/'.join(kinds)}, steps with replay starts {starts}, span counts "
              f"{span_counts}, recorded launches "
              f"{recorded.stats if recorded is not None else None}"
              + (f", FAILED: {bad}" if bad else ""), flush=True)
    finally:
        world.close()
    return not bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", action="append", default=None,
                    help="run this preset's cases only (repeatable); default: every case")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--rounds", type=int, default=4, help="steps per kind")
    args = ap.parse_args(argv)
    cases = [c for c in CASES if args.preset is None or c[0] in args.preset]
    ok = all([one_case(preset, drafts, args.device, args.rounds) for preset, drafts in cases])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
