"""The DeepSeek V4.1 decode consumer in graphs on the GPU: DeepGEMM's indexer logits and
top-k per index type over its ``index_k`` table, the top-k turned into the type's compressed
slots by the compressed builder, FlashMLA's sparse FP8 decode per layer type (window of
32-token pages + the type's compressed keys, one tile-scheduler holder per type). Every
replay checks each top-k and every layer against torch references.

The SM90 kernels' limits decide the configs: on the SM90 kernel block (64) DeepGEMM serves
c1a (64-entry index-K pages) and not c2a (32); on SM100's block (128) c2a (64) and not c1a
(128). So c1a runs on the first config and c2a on the second, each beside window-only
layers; asking for the other type is a typed error (tested on CPU too)."""

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

from helpers.decode_steps import fill_caches, new_inputs, step_problems  # noqa: E402
from helpers.dsa_reference import replay_sizes  # noqa: E402

from staticattn.arena import ArenaConfig  # noqa: E402
from staticattn.builders import default_builders, make_arena  # noqa: E402
from staticattn.consumers.real.factory import real_consumer_step  # noqa: E402
from staticattn.consumers.real.sparse_decode import SparseDecodeStep  # noqa: E402
from staticattn.errors import ConfigError  # noqa: E402
from staticattn.graphs import GraphManager  # noqa: E402

REPLAYS = 100
BLOCKS = 1024
SIZES = (2, 16, 64)


def _v41(preset: str = "deepseek-v4.1-flash", **kw) -> ArenaConfig:
    return ArenaConfig.preset(preset, max_model_len=16384, max_num_seqs=32,
                              max_num_batched_tokens=64, device="cuda", **kw)


def test_factory_serves_what_the_kernels_serve():
    step = real_consumer_step(_v41(), num_kv_blocks=16)
    assert isinstance(step, SparseDecodeStep) and list(step.indexers) == ["c1a"]
    step = real_consumer_step(_v41(block_size=128), num_kv_blocks=16)
    assert list(step.indexers) == ["c2a"]
    with pytest.raises(ConfigError, match="c2a pages hold 32"):
        SparseDecodeStep(_v41(), num_kv_blocks=16)


@pytest.mark.parametrize("preset, block_size, served", [
    ("deepseek-v4.1-flash", 64, "c1a"), ("deepseek-v4.1-flash", 128, "c2a"),
    ("deepseek-v4.1-large", 64, "c1a")])
def test_v41_indexers_feed_flashmla_replays(preset, block_size, served):
    cfg = _v41(preset, block_size=block_size)
    builders = default_builders(cfg)
    arena, inputs = make_arena(cfg, builders)
    step = SparseDecodeStep(cfg, topk_types=[served], num_kv_blocks=BLOCKS, layers_per_type=2)
    keys, deq = fill_caches(step, 3)
    rng = np.random.default_rng(block_size)

    def check(s, out):
        return step_problems(step, inputs, s, out, keys, deq)

    t0 = time.perf_counter()
    with GraphManager(arena, inputs, builders, step, quiet()) as gm:
        gm.capture(SIZES, buckets=())  # the real kernels serve decode tokens
        t1 = time.perf_counter()
        failures, counts = replay_sizes(gm, SIZES, REPLAYS, rng, BLOCKS,
                                        lambda i: new_inputs(step, 5000 + i), check)
        print(f"capture {t1 - t0:.1f}s, layers {[lt for _, lt in step.layers]}; replays per "
              f"size {counts}")
    assert not failures, "\n".join(failures)
    assert all(c >= REPLAYS for c in counts.values()), counts
