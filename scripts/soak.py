"""Soak test on a GPU: many replays with random batch sizes and contents.

Every replay is checked on its lengths (SWA, C128A and indexer decode lengths against a
numpy computation from the host inputs); a sample (--sample, default 1 in 100) is also run
eagerly and compared bit for bit through the gather consumer. Reports mismatches, device
memory before/after, the arena fingerprint and replays per second.

    python scripts/soak.py --replays 100000 --json soak.json
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time

import numpy as np
import torch

from staticattn.arena import ArenaConfig
from staticattn.bench.random_batches import DecodeStream
from staticattn.builders import make_arena
from staticattn.builders.indexer import IndexerMetadataBuilder
from staticattn.builders.sparse_swa import SparseSWAMetadataBuilder
from staticattn.consumers.gather import GatherConsumer
from staticattn.graphs import GraphManager


def expected_lengths(cfg: ArenaConfig, q: np.ndarray, s: np.ndarray, slots: np.ndarray,
                     size: int) -> dict[str, np.ndarray]:
    """Per token of the padded step: SWA, C128A and indexer decode lengths."""
    n = cfg.next_n
    j = np.tile(np.arange(n), q.shape[0])
    L = np.repeat(s.astype(np.int64), n)
    p = L - n + j
    valid = slots >= 0
    pad = size - p.shape[0]
    swa = np.where(valid, np.minimum(p + 1, cfg.sliding_window), 0)
    c128 = np.where(valid, np.minimum((p + 1) // 128, cfg.c128a_max_compressed), 0)
    index = np.maximum(L - n + 1 + j, 0) // cfg.index_compress_ratio
    return {k: np.concatenate([v, np.zeros(pad, dtype=np.int64)])
            for k, v in (("swa", swa), ("c128a", c128), ("indexer", index))}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replays", type=int, default=100_000)
    ap.add_argument("--sample", type=int, default=100, help="1 in N replays compared to eager")
    ap.add_argument("--max-model-len", type=int, default=1 << 20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    cfg = ArenaConfig.deepseek_v4(max_model_len=args.max_model_len)
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    consumer = GatherConsumer(cfg)
    rng = np.random.default_rng(args.seed)
    report = {"replays": 0, "eager_compared": 0, "length_mismatches": 0,
              "eager_mismatches": 0}
    replayed = eager = None
    with GraphManager(arena, inputs, builders, consumer, progress=False) as gm:
        gm.capture()
        sizes = gm.capture_sizes
        stream = DecodeStream(inputs, rng, max_seq_len=args.max_model_len)
        fingerprint = arena.fingerprint()
        torch.cuda.synchronize()
        mem0 = torch.cuda.memory_allocated()
        reserved0 = torch.cuda.memory_reserved()
        t0 = time.perf_counter()
        for i in range(args.replays):
            k = int(rng.integers(1, sizes[-1] // cfg.next_n + 1))
            st = stream.next(k)
            res = gm.run(st.query_lens, st.seq_lens, st.slot_mapping)
            assert res.mode == "graph", res
            g = gm.graphs[res.graph_size]
            exp = expected_lengths(cfg, st.query_lens, st.seq_lens, st.slot_mapping, g.size)
            got = {
                "swa": g.metadata["swa"].decode_swa_lens,
                "c128a": g.metadata["swa"].c128a_decode_lens,
                "indexer": g.metadata["indexer"].decode.seq_lens.reshape(-1),
            }
            for key, t in got.items():
                if not np.array_equal(t.cpu().numpy()[: g.size], exp[key]):
                    report["length_mismatches"] += 1
                    print(f"replay {i}: {key} lengths differ", file=sys.stderr)
            if i % args.sample == 0:
                replayed = res.outputs.clone()
                eager = gm.run_eager(st.query_lens, st.seq_lens, st.slot_mapping)
                report["eager_compared"] += 1
                report["eager_mismatches"] += int(not torch.equal(replayed, eager))
            report["replays"] += 1
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        # Drop the loop's last references (sampled clones, metadata reads) before measuring.
        del res, replayed, eager, got, exp
        gc.collect()
        report.update(
            seconds=elapsed, replays_per_s=report["replays"] / elapsed,
            memory_allocated_delta=torch.cuda.memory_allocated() - mem0,
            memory_reserved_delta=torch.cuda.memory_reserved() - reserved0,
            fingerprint_unchanged=arena.fingerprint() == fingerprint,
            device=torch.cuda.get_device_name(), sizes=f"{sizes[0]}..{sizes[-1]}",
        )
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    ok = (report["length_mismatches"] == 0 and report["eager_mismatches"] == 0
          and report["fingerprint_unchanged"] and report["memory_allocated_delta"] == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
