"""A short capture + replay loop for compute-sanitizer (memcheck, racecheck):

    compute-sanitizer --tool memcheck python scripts/sanitize_loop.py
    compute-sanitizer --tool racecheck python scripts/sanitize_loop.py

Covers the staging kernel, both builders' decode builds (graph) and eager builds with
prefills, the recorded launches of eager steps (recorded and launched again), and the
gather consumer;
small capacities so the sanitizer finishes quickly.
"""

from __future__ import annotations

import numpy as np
import torch

from staticattn.arena import ArenaConfig
from staticattn.bench.random_batches import DecodeStream, random_mixed_step
from staticattn.builders import IndexerMetadataBuilder, SparseSWAMetadataBuilder, make_arena
from staticattn.consumers.gather import GatherConsumer
from staticattn.graphs import EagerBuild, GraphManager, GraphOptions


def main() -> None:
    for drafts in (1, 2):  # native MTP (next_n 2) and the flatten path (next_n 3)
        cfg = ArenaConfig.deepseek_v4(max_num_seqs=16, max_num_batched_tokens=256,
                                      max_model_len=8192, num_speculative_tokens=drafts)
        builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
        arena, inputs = make_arena(cfg, builders)
        rng = np.random.default_rng(0)
        with GraphManager(arena, inputs, builders, GatherConsumer(cfg, 512),
                          GraphOptions(progress=False, num_kv_blocks=512)) as gm:
            n = cfg.next_n
            gm.capture([n, 4 * n, 16 * n])
            stream = DecodeStream(inputs, rng, num_kv_blocks=512)
            for i in range(12):
                st = stream.next(int(rng.integers(1, 17)))
                gm.run(st.query_lens, st.seq_lens, st.slot_mapping)
                if i % 3 == 0:
                    mixed = random_mixed_step(inputs, rng, max_reqs=8, num_kv_blocks=512,
                                              max_prefill_tokens=100)
                    gm.run(mixed.query_lens, mixed.seq_lens, mixed.slot_mapping)
            # The graph builds run eagerly (what a step no graph holds runs), three times per
            # step: the launches of a decode step and of a mixed step are noted, recorded,
            # then launched from the record.
            decode = stream.next(3)
            for _ in range(3):
                for st in (decode, mixed):
                    gm.run(st.query_lens, st.seq_lens, st.slot_mapping, eager=EagerBuild.GRAPH)
            torch.cuda.synchronize()
            recorded = gm.eager.recorded_launches
            print(f"next_n {n}: {gm.stats.replays} replays, eager {dict(gm.stats.eager)}, "
                  f"recorded launches {recorded.stats if recorded is not None else None}")


if __name__ == "__main__":
    main()
