"""Soak test on a GPU: many replays with random batch sizes and contents.

Uniform decode steps (default) or, with ``--mix``, steps of any composition (decodes of
unequal lengths, prefill chunks, fresh prompts) that replay through token buckets. Every
replay is checked on its lengths (SWA, C128A and indexer lengths of every token against a
numpy computation from the host inputs); a sample (--sample, default 1 in 100) is also run
through the reference eager build and compared bit for bit through the gather consumer.
Reports mismatches, device memory before/after, the arena fingerprint and replays per second.
With ``--every-kind`` each step draws its graph kind: a decode size, a token bucket, a
bucket of device-decided lengths (:class:`DeviceLengthSteps`, the step's boundaries
written by a producer captured in the graph) or a context bucket (:class:`ContextGraphs`);
every kind's sampled replays are compared with the eager path, per kind.

    python scripts/soak.py --replays 100000 --json soak.json
    python scripts/soak.py --mix --replays 100000 --max-model-len 65536 --json soak_mix.json
    python scripts/soak.py --every-kind --replays 100000 --sample 10 --json soak_kinds.json
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
from staticattn.bench.random_batches import NUM_KV_BLOCKS, DecodeStream, DeviceStepSource
from staticattn.builders import make_arena
from staticattn.builders.indexer.builder import IndexerMetadataBuilder
from staticattn.builders.swa.builder import SparseSWAMetadataBuilder
from staticattn.consumers.emulated.gather import GatherConsumer
from staticattn.graphs import (
    ContextGraphs,
    DeviceLengthSteps,
    GraphKind,
    GraphManager,
    GraphOptions,
    StagingGuard,
)


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
    c128 = np.where(valid, np.minimum((p + 1) // 128, cfg.dense_width), 0)
    index = np.maximum(L - n + 1 + j, 0) // cfg.index_compress_ratio
    return {k: np.concatenate([v, np.zeros(pad, dtype=np.int64)])
            for k, v in (("swa", swa), ("dense", c128), ("indexer", index))}


def expected_mixed_lengths(cfg: ArenaConfig, q: np.ndarray, s: np.ndarray,
                           slots: np.ndarray, size: int) -> dict[str, np.ndarray]:
    """A token bucket's per-row lengths: SWA, C128A and indexer over the decode rows (real
    decode tokens, then 0), dense over the prefill rows (real prefill tokens, then 0)."""
    n = cfg.next_n
    first_long = int(np.argmax(q > n)) if (q > n).any() else q.shape[0]
    td = int(q[:first_long].sum())
    starts = np.repeat(np.cumsum(q) - q, q)
    p = np.repeat(s.astype(np.int64) - q, q) + np.arange(int(q.sum())) - starts
    valid = slots >= 0
    rows = min(size, cfg.max_decode_tokens)

    def pad(values: np.ndarray, extent: int) -> np.ndarray:
        return np.concatenate([values, np.zeros(extent - values.shape[0], dtype=np.int64)])

    c128 = np.minimum((p + 1) // 128, cfg.dense_width)
    return {
        "swa": pad(np.where(valid, np.minimum(p + 1, cfg.sliding_window), 0)[:td], rows),
        "dense": pad(np.where(valid, c128, 0)[:td], rows),
        "dense_prefill": pad(c128[td:], size),
        "indexer": pad(((p + 1) // cfg.index_compress_ratio)[:td], rows),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replays", type=int, default=100_000)
    ap.add_argument("--sample", type=int, default=100, help="1 in N replays compared to eager")
    ap.add_argument("--max-model-len", type=int, default=1 << 20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mix", action="store_true", help="steps of any composition")
    ap.add_argument("--every-kind", action="store_true",
                    help="each step draws decode, token bucket, device lengths or context")
    ap.add_argument("--staging-guard", choices=["staging", "step"], default="staging",
                    help="where the graphs record the staging event (GraphManager)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.every_kind:
        return every_kind(args)

    cfg = ArenaConfig.deepseek_v4(max_model_len=args.max_model_len)
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    consumer = GatherConsumer(cfg)
    rng = np.random.default_rng(args.seed)
    report = {"replays": 0, "mixed_replays": 0, "eager_compared": 0,
              "length_mismatches": 0, "eager_mismatches": 0}
    replayed = eager = None
    report["staging_guard"] = args.staging_guard
    options = GraphOptions(progress=False, staging_guard=StagingGuard(args.staging_guard),
                           num_kv_blocks=NUM_KV_BLOCKS)
    with GraphManager(arena, inputs, builders, consumer, options) as gm:
        gm.capture(buckets=None if args.mix else ())
        sizes = gm.capture_sizes
        stream = DecodeStream(inputs, rng, max_seq_len=args.max_model_len)
        fingerprint = arena.fingerprint()
        torch.cuda.synchronize()
        mem0 = torch.cuda.memory_allocated()
        reserved0 = torch.cuda.memory_reserved()
        t0 = time.perf_counter()
        for i in range(args.replays):
            if args.mix:
                st = stream.next_mixed(int(rng.choice(gm.buckets)))
            else:
                st = stream.next(int(rng.integers(1, sizes[-1] // cfg.next_n + 1)))
            res = gm.run(st.query_lens, st.seq_lens, st.slot_mapping)
            assert res.mode == "graph", res
            g = gm.graph_for(res.graph_size, res.graph_kind)
            swa_md, index_md = g.metadata["swa"], g.metadata["indexer"]
            got = {
                "swa": swa_md.decode_swa_lens,
                "dense": swa_md.dense_decode_lens,
                "indexer": index_md.decode.seq_lens.reshape(-1),
            }
            if g.kind is GraphKind.MIXED:
                exp = expected_mixed_lengths(cfg, st.query_lens, st.seq_lens, st.slot_mapping,
                                             g.size)
                got["dense_prefill"] = swa_md.dense_prefill_lens
                report["mixed_replays"] += 1
            else:
                exp = expected_lengths(cfg, st.query_lens, st.seq_lens, st.slot_mapping,
                                       g.size)
            for key, t in got.items():
                if not np.array_equal(t.cpu().numpy(), exp[key]):
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


def every_kind(args) -> int:
    """Steps over every graph kind, each one's sampled replays compared with the eager path
    (the real tokens' rows, bit for bit)."""
    cfg = ArenaConfig.deepseek_v4(max_model_len=args.max_model_len)
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    consumer = GatherConsumer(cfg)
    rng = np.random.default_rng(args.seed)
    kinds = ["decode", "mixed", "device", "context"]
    report = {k: {"replays": 0, "eager": 0, "eager_compared": 0, "eager_mismatches": 0}
              for k in kinds}
    options = GraphOptions(progress=False, num_kv_blocks=NUM_KV_BLOCKS)
    source = DeviceStepSource(cfg, arena.device)
    contexts = [args.max_model_len // 64, args.max_model_len // 8, args.max_model_len]
    with GraphManager(arena, inputs, builders, consumer, options) as gm, \
            ContextGraphs(arena, inputs, builders, consumer, contexts=contexts,
                          options=options) as cg:
        gm.capture(buckets=None)
        device = DeviceLengthSteps(gm, source)
        device.capture()
        cg.capture(buckets=())  # decode sizes per context bucket
        stream = DecodeStream(inputs, rng, max_seq_len=args.max_model_len)
        sizes, buckets = gm.capture_sizes, gm.buckets
        fingerprint = arena.fingerprint()
        torch.cuda.synchronize()
        mem_capture = torch.cuda.memory_allocated()
        warmup = min(args.replays, 1000)  # first uses (the eager path's caches) before mem0
        t0 = time.perf_counter()
        for i in range(args.replays):
            if i == warmup:  # nothing of the loop's own held: the baseline of growth
                got = want = None
                torch.cuda.synchronize()
                mem0, reserved0 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
            kind = kinds[i % 4]
            if kind == "decode":
                st = stream.next(int(rng.integers(1, sizes[-1] // cfg.next_n + 1)))
            elif kind == "context":  # decode steps within a drawn context bucket
                st = stream.next(int(rng.integers(1, sizes[-1] // cfg.next_n + 1)),
                                 longest=int(rng.choice(contexts)))
            else:
                st = stream.next_mixed(int(rng.choice(buckets)))
            q, s, slots = st.query_lens, st.seq_lens, st.slot_mapping
            nt = int(q.sum())
            if kind == "device":
                source.fill(st)
                out = device.launch(q.shape[0], nt)
                graphed = device.graph_for(q.shape[0], nt) is not None
            else:
                res = (cg if kind == "context" else gm).run(q, s, slots)
                out, graphed = res.outputs, res.mode == "graph"
            entry = report[kind]
            entry["replays"] += int(graphed)
            entry["eager"] += int(not graphed)
            if i % args.sample < 4:  # each kind sampled alike
                got = out[:nt].clone()
                want = gm.run_eager(q, s, slots)[:nt]
                entry["eager_compared"] += 1
                if not torch.equal(got, want):
                    entry["eager_mismatches"] += 1
                    print(f"step {i} ({kind}): replay differs from the eager path",
                          file=sys.stderr)
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        # Drop the loop's last references (the sampled clone, views) before measuring.
        del out, st, got, want
        res = None
        gc.collect()
        result = {
            "command": "python scripts/soak.py --every-kind " + " ".join(sys.argv[2:]),
            "steps": args.replays, "kinds": report, "seconds": elapsed,
            "steps_per_s": args.replays / elapsed,
            "warmup_steps": warmup,
            "memory_allocated_delta": torch.cuda.memory_allocated() - mem0,
            "memory_reserved_delta": torch.cuda.memory_reserved() - reserved0,
            "memory_allocated_since_capture": torch.cuda.memory_allocated() - mem_capture,
            "fingerprint_unchanged": arena.fingerprint() == fingerprint,
            "device": torch.cuda.get_device_name(), "decode_sizes": f"{sizes[0]}..{sizes[-1]}",
            "buckets": buckets, "contexts": contexts,
        }
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    ok = (all(e["eager_mismatches"] == 0 and e["replays"] > 0 for e in report.values())
          and result["fingerprint_unchanged"] and result["memory_allocated_delta"] == 0
          and result["memory_allocated_since_capture"] == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
