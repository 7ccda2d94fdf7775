"""A short capture + replay loop for compute-sanitizer (memcheck, racecheck) over every graph
kind:

    compute-sanitizer --tool memcheck python scripts/sanitize_loop.py
    compute-sanitizer --tool racecheck python scripts/sanitize_loop.py

For DeepSeek V4 (native MTP, next_n 2, and the flatten path, next_n 3) and V4.1-Flash, with
the preset's default builders and the gather consumer: decode graphs, token-bucket graphs
(mixed steps), graphs of device-decided lengths, context buckets, and the eager graph builds
of steps no graph holds (noted, recorded, then launched from the record). Small capacities
so the sanitizer finishes quickly; every graph kind must have replayed.
"""

from __future__ import annotations

import numpy as np
import torch

from staticattn.arena import ArenaConfig
from staticattn.bench.random_batches import DecodeStream, DeviceStepSource
from staticattn.builders import default_builders, make_arena
from staticattn.consumers.emulated.gather import GatherConsumer
from staticattn.graphs import (
    ContextGraphs,
    DeviceLengthSteps,
    EagerBuild,
    GraphKind,
    GraphManager,
    GraphOptions,
)

POOL = 512
CASES = [("deepseek-v4", 1), ("deepseek-v4", 2), ("deepseek-v4.1-flash", 1)]


def one_case(preset: str, drafts: int) -> None:
    cfg = ArenaConfig.preset(preset, max_num_seqs=16, max_num_batched_tokens=256,
                             max_model_len=8192, num_speculative_tokens=drafts)
    builders = default_builders(cfg)
    arena, inputs = make_arena(cfg, builders)
    rng = np.random.default_rng(0)
    consumer = GatherConsumer(cfg, POOL)
    options = GraphOptions(progress=False, num_kv_blocks=POOL)
    source = DeviceStepSource(cfg, arena.device)
    n = cfg.next_n
    with GraphManager(arena, inputs, builders, consumer, options) as gm, \
            ContextGraphs(arena, inputs, builders, consumer, contexts=[1024, 8192],
                          options=options) as cg:
        gm.capture([n, 4 * n, 16 * n], buckets=[64, 256])
        device = DeviceLengthSteps(gm, source)
        device.capture([64, 256])
        cg.capture([n, 4 * n], buckets=())
        stream = DecodeStream(inputs, rng, max_seq_len=8192, num_kv_blocks=POOL)
        for i in range(8):
            st = stream.next(int(rng.integers(1, 17)))
            gm.run(st.query_lens, st.seq_lens, st.slot_mapping)
            mixed = stream.next_mixed(int(rng.choice([40, 200])))
            gm.run(mixed.query_lens, mixed.seq_lens, mixed.slot_mapping)
            source.fill(mixed)
            device.launch(mixed.query_lens.shape[0], int(mixed.query_lens.sum()))
            short = stream.next(int(rng.integers(1, 5)), longest=1024 if i % 2 else 8192)
            cg.run(short.query_lens, short.seq_lens, short.slot_mapping)
        # The graph builds run eagerly (what a step no graph holds runs), three times per
        # step: the launches of a decode step and of a mixed step are noted, recorded,
        # then launched from the record.
        decode = stream.next(3)
        for _ in range(3):
            for st in (decode, mixed):
                gm.run(st.query_lens, st.seq_lens, st.slot_mapping, eager=EagerBuild.GRAPH)
        torch.cuda.synchronize()
        stats, kinds = gm.stats, (GraphKind.DECODE, GraphKind.MIXED, GraphKind.DEVICE_LENGTHS)
        assert all(stats.replays[k] for k in kinds) and cg.stats.replays[GraphKind.DECODE], \
            "a graph kind never replayed"
        recorded = gm.eager.recorded_launches
        print(f"{preset} next_n {n}: replays {dict(stats.replays)}, eager {dict(stats.eager)}, "
              f"context replays {dict(cg.stats.context_replays)}, "
              f"recorded launches {recorded.stats if recorded is not None else None}")


def main() -> None:
    for preset, drafts in CASES:
        one_case(preset, drafts)


if __name__ == "__main__":
    main()
