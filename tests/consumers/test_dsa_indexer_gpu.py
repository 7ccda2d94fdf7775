"""The indexer's real consumer captured in the graph: staging + IndexerMetadataBuilder +
DeepGEMM ``fp8_paged_mqa_logits`` + masked top-k, replayed on randomized batches (padded ones
included, captured at minimal lengths and replayed at long ones), each replay's top-k
checked against a torch reference built from the host truth."""

from __future__ import annotations

import time

import numpy as np
import pytest
from helpers.support import quiet

from staticattn.kernels.runtime.dsa_libs import DEEP_GEMM, import_error

pytestmark = pytest.mark.gpu

if import_error(DEEP_GEMM):
    pytest.skip(import_error(DEEP_GEMM), allow_module_level=True)

from helpers.dsa_reference import (  # noqa: E402
    fill_indexer_cache,
    indexer_problems,
    new_indexer_inputs,
    replay_sizes,
)

from staticattn.arena import ArenaConfig  # noqa: E402
from staticattn.builders import make_arena  # noqa: E402
from staticattn.builders.indexer.builder import IndexerMetadataBuilder  # noqa: E402
from staticattn.consumers.real.indexer_topk import IndexerTopKStep  # noqa: E402
from staticattn.graphs import GraphManager  # noqa: E402

REPLAYS = 200
BLOCKS = 2048

CONFIGS = {
    # V3.2: 64-token blocks, R = 1, plain decode, top-2048
    "v32": (dict(preset="deepseek-v3.2", max_model_len=32768, max_num_seqs=64,
                 max_num_batched_tokens=64), (2, 16, 64)),
    # V4: 256-token blocks, R = 4 (64 compressed entries per block), native MTP next_n = 2
    "v4-mtp2": (dict(preset="deepseek-v4", max_model_len=65536, max_num_seqs=32,
                     max_num_batched_tokens=64), (2, 16, 64)),
    # V3.2 with next_n = 3: flattened to single-token rows with an expanded block table
    "v32-mtp3-flat": (dict(preset="deepseek-v3.2", max_model_len=16384,
                           num_speculative_tokens=2, max_num_seqs=21,
                           max_num_batched_tokens=63), (3, 15, 63)),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_indexer_topk_replays(name):
    kw, sizes = CONFIGS[name]
    kw = dict(kw)
    cfg = ArenaConfig.preset(kw.pop("preset"), device="cuda", **kw)
    builders = [IndexerMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    step = IndexerTopKStep(cfg, num_kv_blocks=BLOCKS)
    keys = fill_indexer_cache(step)
    rng = np.random.default_rng(list(CONFIGS).index(name))
    t0 = time.perf_counter()
    with GraphManager(arena, inputs, builders, step, quiet()) as gm:
        # Decode graphs only: the real kernels serve decode tokens. The warm-up per size is
        # one eager pass: DeepGEMM JIT-compiles there.
        gm.capture(sizes, buckets=())
        t1 = time.perf_counter()
        failures, counts = replay_sizes(
            gm, sizes, REPLAYS, rng, BLOCKS,
            before=lambda i: new_indexer_inputs(step, 1000 + i),
            check=lambda s, out: indexer_problems(step, inputs, s, out, keys),
        )
        print(f"{name}: capture {t1 - t0:.1f}s, {sum(counts.values())} replays "
              f"{time.perf_counter() - t1:.1f}s; top-k {step.topk} of up to "
              f"{step.max_context_len} keys; replays per size {counts}")
    assert not failures, "\n".join(failures)
    assert all(c >= REPLAYS for c in counts.values()), counts
