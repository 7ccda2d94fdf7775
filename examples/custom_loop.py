"""A toy serving loop that embeds staticattn the way an engine does.

Requests arrive, are prefilled in chunks under a per-step token budget beside the running
decodes (MTP: each verifies ``next_n`` tokens), grow a block at a time and finish. Each step
the engine orders its batch decodes first, writes that order's block-table rows in place,
writes the query starts, sequence lengths and slots into the pinned staging
(``begin_step``) and launches the step (``launch``). The step function is the engine's own:
a tiny sliding-window attention over a random KV cache, read through the SWA metadata.

On a GPU every step replays a captured graph; without CUDA every step runs eagerly on the
CPU kernels (the builds a graph holds), and the loop says so. Either way each step is checked
twice: its output against the same step through the reference builds (``run(...,
eager=EagerBuild.REFERENCE)``), and the reference builds' metadata, field by field, against
the plain-Python reference (:mod:`staticattn.reference`). At the end: the replay share and
the mismatches.

    python -m examples.custom_loop [--steps 200]      (from the repository root)
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

from staticattn import ArenaConfig, EagerBuild, GraphManager, GraphOptions, make_arena
from staticattn.builders import IndexerMetadataBuilder, SparseSWAMetadataBuilder
from staticattn.checks import reference_mismatch

HEAD_DIM, NUM_BLOCKS, BUDGET = 32, 4096, 256


class WindowAttention:
    """The engine's step: decode tokens attend over their SWA window (``decode_swa_indices``,
    -1 = no entry) in a random cache. Graph-safe: fixed buffers, no host read."""

    def __init__(self, cfg: ArenaConfig, device: str) -> None:
        gen = torch.Generator().manual_seed(0)
        self.cache = torch.randn(NUM_BLOCKS * cfg.swa_block_size, HEAD_DIM, generator=gen).to(
            device)
        self.query = torch.randn(cfg.max_num_batched_tokens, HEAD_DIM, generator=gen).to(device)
        self.out = torch.zeros(cfg.max_num_batched_tokens, HEAD_DIM, device=device)

    def __call__(self, batch, metadata):
        idx = metadata["swa"].decode_swa_indices[:, 0, :]  # (rows, window) int32
        rows = idx.shape[0]
        keys = self.cache[idx.clamp(min=0).long()]  # (rows, window, HEAD_DIM)
        scores = (keys * self.query[:rows, None, :]).sum(-1).masked_fill(idx < 0, -1e30)
        weights = torch.softmax(scores, dim=-1) * (idx >= 0)
        self.out[:rows].copy_((weights[..., None] * keys).sum(1))
        self.out[rows : batch.num_actual_tokens].zero_()  # prefill tokens: not attended here
        return self.out[: batch.num_actual_tokens]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    cfg = ArenaConfig.deepseek_v4(max_num_seqs=16, max_num_batched_tokens=512,
                                  max_model_len=4096, num_speculative_tokens=1, device=device)
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    rng = np.random.default_rng(0)
    free = list(range(1, NUM_BLOCKS))  # block 0 stays the null block
    requests = []  # dicts: prompt, done (tokens in the cache), blocks, swa_blocks
    steps = replays = mismatches = reference_mismatches = 0
    first_mismatch = None
    print("graphs: captured below" if cuda else "no CUDA: every step runs eagerly on the CPU")
    with GraphManager(arena, inputs, builders, WindowAttention(cfg, device),
                      GraphOptions(progress=False, num_kv_blocks=NUM_BLOCKS)) as gm:
        if cuda:
            gm.capture()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        while steps < args.steps:
            while len(requests) < cfg.max_num_seqs and rng.random() < 0.4:
                requests.append(dict(prompt=int(rng.integers(50, 600)), done=0, blocks=[],
                                     swa_blocks=[]))
            decodes = [r for r in requests if r["done"] >= r["prompt"]]
            prefills = [r for r in requests if r["done"] < r["prompt"]]
            batch, query_lens = list(decodes), [cfg.next_n] * len(decodes)
            budget = BUDGET - cfg.next_n * len(decodes)
            for r in prefills:  # chunked prefill: what the budget leaves
                chunk = min(r["prompt"] - r["done"], budget)
                if chunk > 0:
                    batch.append(r)
                    query_lens.append(chunk)
                    budget -= chunk
            if not batch:
                continue
            # Decodes first: a chunk as short as a decode (the tail of a prompt) is one.
            order = sorted(range(len(batch)), key=lambda i: query_lens[i] > cfg.next_n)
            batch, query_lens = [batch[i] for i in order], [query_lens[i] for i in order]
            seq_lens, slots = [], []
            for b, (r, q) in enumerate(zip(batch, query_lens)):
                length = r["done"] + q
                for blocks, size in ((r["blocks"], cfg.block_size),
                                     (r["swa_blocks"], cfg.swa_block_size)):
                    while len(blocks) * size < length:  # grow a block at a time
                        blocks.append(free.pop())
                # This step's order is the batch order: write its rows in place, each id
                # checked against the KV pool.
                gm.write_blocks("block_table", b, r["blocks"])
                gm.write_blocks("swa_block_table", b, r["swa_blocks"])
                # The slot mapping addresses the SWA group's cache (its blocks bound it).
                pos, size = np.arange(r["done"], length), cfg.swa_block_size
                table = np.array(r["swa_blocks"])
                slots.append(table[pos // size] * size + pos % size)
                seq_lens.append(length)
            q, seq, slot = np.array(query_lens), np.array(seq_lens), np.concatenate(slots)
            k, t = len(q), int(q.sum())
            host = gm.begin_step()  # the pinned staging, once the last step has read it
            host.query_start_loc[: k + 1] = np.cumsum([0, *q])
            host.seq_lens[:k], host.slot_mapping[:t] = seq, slot
            replays_before, gpu = gm.stats.replays_total, ""
            if cuda:
                start.record()
            t0 = time.perf_counter()
            out = gm.launch(k, t)[:t]  # the graph that holds the step, else eagerly
            host_us = (time.perf_counter() - t0) * 1e6
            if cuda:
                end.record()
                end.synchronize()
                gpu = f", GPU {start.elapsed_time(end) * 1e3:.1f} us"
            graph = gm.stats.replays_total > replays_before
            replays += graph
            # The same step through the reference builds: equal up to float rounding.
            out = out.clone()  # the step's outputs live until the next step
            eager = gm.run(q, seq, slot, eager=EagerBuild.REFERENCE).outputs
            mismatches += not torch.allclose(out, eager, rtol=1e-5, atol=1e-6)
            # The reference builds' metadata against the plain-Python reference.
            mismatch = reference_mismatch(gm, q, seq, slot)
            reference_mismatches += mismatch is not None
            first_mismatch = first_mismatch or mismatch
            steps += 1
            print(f"step {steps:3d}: {len(decodes):2d} decodes, {k - len(decodes)} "
                  f"prefill chunks, {t:4d} tokens -> {'graph' if graph else 'eager'}, host "
                  f"{host_us:.0f} us{gpu}")
            for r, q in zip(batch, query_lens):
                r["done"] += q
            for r in [r for r in requests if r["done"] >= r["prompt"] + 40]:  # finished
                free += r["blocks"] + r["swa_blocks"]
                requests.remove(r)
        if cuda:
            print(gm.describe())
        else:  # "forced": the reference builds this loop runs for its check
            print("eager steps: " + ", ".join(f"{why.value} {n}"
                                              for why, n in gm.stats.eager.items()))
    print(f"{steps} steps, {replays} replayed ({100 * replays / max(steps, 1):.0f}%)")
    print(f"checked {steps} steps against the reference builds (outputs): {mismatches} "
          "mismatches")
    print(f"checked {steps} steps' metadata against staticattn.reference: "
          f"{reference_mismatches} mismatches" + (f" (first: {first_mismatch})"
                                                  if first_mismatch else ""))
    ok = steps > 0 and mismatches == reference_mismatches == 0
    print(f"{'PASS' if ok else 'FAIL'}: {steps} steps checked, "
          f"{mismatches + reference_mismatches} mismatches")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
