"""Replay counts of the hidden-input paths -- run, the in-place launch, context buckets,
device-decided lengths -- on one seeded sequence of steps, read from the managers' own
counters (GPU). It reads the counters of this tree and of the trees before the dispatcher
(e89e713: per-bucket managers, a counter per path), so that one sequence can be compared
across the change: run it from a tree's root (``PYTHONPATH=. python scripts/replay_counts.py
2000``); the staticattn imported is that tree's."""

import json
import sys

import numpy as np
import torch

from staticattn.arena import ArenaConfig
from staticattn.bench.random_batches import NUM_KV_BLOCKS, DecodeStream, DeviceStepSource
from staticattn.builders import make_arena
from staticattn.builders.indexer.builder import IndexerMetadataBuilder
from staticattn.builders.swa.builder import SparseSWAMetadataBuilder
from staticattn.graphs import ContextGraphs, DeviceLengthSteps, GraphManager, GraphOptions

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
cfg = ArenaConfig.deepseek_v4(max_model_len=65536)
builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
arena, inputs = make_arena(cfg, builders)
step = lambda batch, md: None  # noqa: E731
rng = np.random.default_rng(0)
opts = GraphOptions(progress=False, num_kv_blocks=NUM_KV_BLOCKS)
source = DeviceStepSource(cfg, arena.device)
contexts = [1024, 8192, 65536]
gm = GraphManager(arena, inputs, builders, step, opts)
cg = ContextGraphs(arena, inputs, builders, step, contexts=contexts, options=opts)
gm.capture([2, 8, 32, 64], buckets=[64, 256, 1024])
device = DeviceLengthSteps(gm, source)
device.capture([64, 256])
cg.capture([2, 8, 32], buckets=())
stream = DecodeStream(inputs, rng, max_seq_len=65536)
for i in range(STEPS):
    path = ("run", "in-place", "context", "device")[i % 4]
    if path == "device" or i % 8 == 1:
        st = stream.next_mixed(int(rng.choice([64, 256, 2048])))
    else:
        st = stream.next(int(rng.integers(1, 48)), longest=int(rng.choice(contexts)))
    q, s, slots = st.query_lens, st.seq_lens, st.slot_mapping
    k, t = len(q), int(q.sum())
    if path == "device":
        source.fill(st)
        device.launch(k, t)
    elif path in ("run", "context"):
        (gm if path == "run" else cg).run(q, s, slots)
    else:
        views = gm.begin_step()
        views.seq_lens[:k], views.slot_mapping[:t] = s, slots
        views.query_start_loc[: k + 1] = np.concatenate(([0], np.cumsum(q)))
        if (q == cfg.next_n).all():
            gm.launch(k)
        else:
            gm.launch(k, t)
torch.cuda.synchronize()


def counts(manager):
    st = manager.stats
    if hasattr(st, "mixed_replays"):  # before: decode and mixed counters, string reasons
        return {"decode": st.replays, "mixed": st.mixed_replays,
                "eager": {str(r): n for r, n in sorted(st.eager.items())}}
    return {"decode": st.replays.get(next(k for k in st.replays if k.value == "decode"), 0)
            if st.replays else 0,
            "mixed": sum(n for k, n in st.replays.items() if k.value == "mixed"),
            "device-lengths": sum(n for k, n in st.replays.items()
                                  if k.value == "device-lengths"),
            "eager": {r.value: n for r, n in sorted(st.eager.items(), key=lambda x: x[0].value)}}


out = {"manager (run + in-place + device lengths)": counts(gm)}
if hasattr(device, "replays"):
    out["device-length steps"] = {"replays": device.replays,
                                  "eager": dict(sorted(device.eager.items()))}
if hasattr(cg, "context_buckets"):
    out["context buckets"] = [counts(b.manager) for b in cg.context_buckets]
else:
    out["context buckets"] = {"per bucket": [cg.stats.context_replays[c] for c in contexts],
                              **counts(cg)}
print(json.dumps(out, indent=1))
