"""Where the GPU time of one replayed step goes: per-kernel durations from the profiler.

    python scripts/profile_replay.py --batch-requests 1 256 [--preset deepseek-v4]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from staticattn.arena import ArenaConfig
from staticattn.bench.random_batches import NUM_KV_BLOCKS, DecodeStream
from staticattn.builders import IndexerMetadataBuilder, SparseSWAMetadataBuilder, make_arena
from staticattn.graphs import GraphManager, GraphOptions


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-requests", type=int, nargs="+", default=[1, 256],
                    help="batch sizes, in requests")
    ap.add_argument("--preset", default="deepseek-v4")
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    cfg = ArenaConfig.preset(args.preset)
    builders = [IndexerMetadataBuilder()] + ([SparseSWAMetadataBuilder()] if cfg.has_swa else [])
    arena, inputs = make_arena(cfg, builders)
    rng = np.random.default_rng(0)
    stream = DecodeStream(inputs, rng)
    with GraphManager(arena, inputs, builders, lambda b, m: None,
                      GraphOptions(progress=False, num_kv_blocks=NUM_KV_BLOCKS)) as gm:
        gm.capture([b * cfg.next_n for b in args.batch_requests])
        for b in args.batch_requests:
            st = stream.next(b)
            for _ in range(5):
                gm.run(st.query_lens, st.seq_lens, st.slot_mapping)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(args.reps):
                    gm.run(st.query_lens, st.seq_lens, st.slot_mapping)
                torch.cuda.synchronize()
            print(f"--- batch {b} requests ({b * cfg.next_n} tokens), {args.reps} replays")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12,
                                            max_name_column_width=60))


if __name__ == "__main__":
    main()
