"""FlashMLA's sparse FP8 decode captured in the graph behind the V4 builders (indexer + SWA):
SWA-only and dense layers, two of each sharing their type's tile-scheduler metadata
(filled inside the capture), replayed on randomized batches with fresh queries, each replay's
output compared with a torch sparse-attention reference built from the host truth."""

from __future__ import annotations

import time

import numpy as np
import pytest
from helpers.support import quiet

from staticattn.kernels.runtime.dsa_libs import FLASH_MLA, import_error

pytestmark = pytest.mark.gpu

if import_error(FLASH_MLA):
    pytest.skip(import_error(FLASH_MLA), allow_module_level=True)

from helpers.decode_steps import fill_caches, new_inputs, step_problems  # noqa: E402
from helpers.dsa_reference import replay_sizes  # noqa: E402

from staticattn.arena import ArenaConfig  # noqa: E402
from staticattn.builders import make_arena  # noqa: E402
from staticattn.builders.indexer.builder import IndexerMetadataBuilder  # noqa: E402
from staticattn.builders.swa.builder import SparseSWAMetadataBuilder  # noqa: E402
from staticattn.consumers.real.sparse_decode import SparseDecodeStep  # noqa: E402
from staticattn.graphs import GraphManager  # noqa: E402

REPLAYS = 200
BLOCKS = 1024
SIZES = (2, 16, 64)


def test_flashmla_sparse_decode_replays():
    cfg = ArenaConfig.deepseek_v4(max_model_len=16384, max_num_seqs=32,
                                  max_num_batched_tokens=64, device="cuda")
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    # FlashMLA alone: swaonly, c128a, swaonly, c128a
    step = SparseDecodeStep(cfg, topk_types=(), num_kv_blocks=BLOCKS, layers_per_type=2)
    keys, deq = fill_caches(step)
    rng = np.random.default_rng(7)
    t0 = time.perf_counter()
    with GraphManager(arena, inputs, builders, step, quiet()) as gm:
        gm.capture(SIZES, buckets=())  # the real kernels serve decode tokens
        for size in SIZES:  # tile-scheduler metadata made inside the capture, per layer type
            md = gm.graphs[size].metadata["swa"]
            for layer_type in step.layer_types:
                sched = md.tile_sched(layer_type)
                assert sched.have_initialized and sched.tile_scheduler_metadata is not None
        t1 = time.perf_counter()
        failures, counts = replay_sizes(
            gm, SIZES, REPLAYS, rng, BLOCKS,
            before=lambda i: new_inputs(step, 2000 + i),
            check=lambda s, out: step_problems(step, inputs, s, out, keys, deq),
        )
        print(f"capture {t1 - t0:.1f}s, {sum(counts.values())} replays "
              f"{time.perf_counter() - t1:.1f}s, {step.num_layers} layers "
              f"{[lt for _, lt in step.layers]}; replays per size {counts}")
    assert not failures, "\n".join(failures)
    assert all(c >= REPLAYS for c in counts.values()), counts
