"""The whole V4 decode consumer in one graph: DeepGEMM indexer logits + top-k, whose indices
become the top-k type's (c4a) extra keys for FlashMLA through the compressed builder, next to
SWA-only and dense layers (two of each type). Every replay checks the top-k and every
layer's attention against torch references."""

from __future__ import annotations

import time

import numpy as np
import pytest
from helpers.support import quiet

from staticattn.kernels.runtime.dsa_libs import DEEP_GEMM, FLASH_MLA, available, import_error

pytestmark = pytest.mark.gpu

for _lib in (DEEP_GEMM, FLASH_MLA):
    if import_error(_lib):
        pytest.skip(import_error(_lib), allow_module_level=True)

from helpers.decode_steps import fill_caches, new_inputs, step_problems  # noqa: E402
from helpers.dsa_reference import replay_sizes  # noqa: E402

from staticattn.arena import ArenaConfig  # noqa: E402
from staticattn.builders import default_builders, make_arena  # noqa: E402
from staticattn.consumers.real.factory import real_consumer_step  # noqa: E402
from staticattn.consumers.real.sparse_decode import SparseDecodeStep  # noqa: E402
from staticattn.graphs import GraphManager  # noqa: E402

REPLAYS = 200
BLOCKS = 1024
SIZES = (2, 16, 64)


def test_factory_picks_the_chain():
    assert available() == {"deep_gemm": True, "flash_mla": True}
    cfg = ArenaConfig.deepseek_v4(max_model_len=16384, max_num_seqs=8,
                                  max_num_batched_tokens=16, device="cuda")
    step = real_consumer_step(cfg, num_kv_blocks=16)
    assert isinstance(step, SparseDecodeStep) and list(step.indexers) == ["c4a"]


def test_indexer_feeds_flashmla_replays():
    cfg = ArenaConfig.deepseek_v4(max_model_len=16384, max_num_seqs=32,
                                  max_num_batched_tokens=64, device="cuda")
    builders = default_builders(cfg)
    arena, inputs = make_arena(cfg, builders)
    step = SparseDecodeStep(cfg, num_kv_blocks=BLOCKS, layers_per_type=2)
    keys, deq = fill_caches(step, 3)
    rng = np.random.default_rng(11)

    def check(s, out):
        return step_problems(step, inputs, s, out, keys, deq)

    t0 = time.perf_counter()
    with GraphManager(arena, inputs, builders, step, quiet()) as gm:
        gm.capture(SIZES, buckets=())  # the real kernels serve decode tokens
        t1 = time.perf_counter()
        failures, counts = replay_sizes(gm, SIZES, REPLAYS, rng, BLOCKS,
                                        lambda i: new_inputs(step, 3000 + i), check)
        print(f"capture {t1 - t0:.1f}s, {sum(counts.values())} replays "
              f"{time.perf_counter() - t1:.1f}s, layers "
              f"{[lt for _, lt in step.layers]}; replays per size {counts}")
    assert not failures, "\n".join(failures)
    assert all(c >= REPLAYS for c in counts.values()), counts
