"""The whole V4 decode consumer in one graph: DeepGEMM indexer logits + top-k, whose indices
become the C4A layers' extra keys for FlashMLA, next to SWA-only and dense layers (two of each
type). Every replay checks the top-k and every layer's attention against torch references."""

from __future__ import annotations

import time

import numpy as np
import pytest
from helpers.support import quiet

from staticattn.kernels.runtime.dsa_libs import DEEP_GEMM, FLASH_MLA, import_error

pytestmark = pytest.mark.gpu

for _lib in (DEEP_GEMM, FLASH_MLA):
    if import_error(_lib):
        pytest.skip(import_error(_lib), allow_module_level=True)

from helpers.dsa_reference import (  # noqa: E402
    attention_step_problems,
    fill_attention_caches,
    fill_indexer_cache,
    indexer_problems,
    new_attention_inputs,
    new_indexer_inputs,
    replay_sizes,
)

from staticattn.arena import ArenaConfig  # noqa: E402
from staticattn.builders import make_arena  # noqa: E402
from staticattn.builders.indexer.builder import IndexerMetadataBuilder  # noqa: E402
from staticattn.builders.swa.builder import SparseSWAMetadataBuilder  # noqa: E402
from staticattn.consumers.real.chain import (  # noqa: E402
    DSADecodeStep,
    real_consumer_step,
    real_consumers_available,
)
from staticattn.graphs import GraphManager  # noqa: E402

REPLAYS = 200
BLOCKS = 1024
SIZES = (2, 16, 64)


def test_factory_picks_the_chain():
    assert real_consumers_available() == {"deep_gemm": True, "flash_mla": True}
    cfg = ArenaConfig.deepseek_v4(max_model_len=16384, max_num_seqs=8,
                                  max_num_batched_tokens=16, device="cuda")
    assert isinstance(real_consumer_step(cfg, num_kv_blocks=16), DSADecodeStep)


def test_indexer_feeds_flashmla_replays():
    cfg = ArenaConfig.deepseek_v4(max_model_len=16384, max_num_seqs=32,
                                  max_num_batched_tokens=64, device="cuda")
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    step = DSADecodeStep(cfg, num_kv_blocks=BLOCKS)
    keys = fill_indexer_cache(step.indexer, 3)
    deq = fill_attention_caches(step.attention, 4)
    rng = np.random.default_rng(11)

    def before(i):
        new_indexer_inputs(step.indexer, 3000 + i)
        new_attention_inputs(step.attention, 4000 + i)

    def check(s, out):
        t = int(s.query_lens.sum())
        topk = out["topk"]
        problems = [f"top-k: {p}" for p in indexer_problems(step.indexer, inputs, s, topk, keys)]
        return problems + attention_step_problems(step.attention, inputs, s, out["attn"], deq,
                                                  topk[:t].cpu().numpy())

    t0 = time.perf_counter()
    with GraphManager(arena, inputs, builders, step, quiet()) as gm:
        gm.capture(SIZES, buckets=())  # the real kernels serve decode tokens
        t1 = time.perf_counter()
        failures, counts = replay_sizes(gm, SIZES, REPLAYS, rng, BLOCKS, before, check)
        print(f"capture {t1 - t0:.1f}s, {sum(counts.values())} replays "
              f"{time.perf_counter() - t1:.1f}s, layers "
              f"{[lt for _, lt in step.attention.layers]}; replays per size {counts}")
    assert not failures, "\n".join(failures)
    assert all(c >= REPLAYS for c in counts.values()), counts
