"""One step through the GraphManager: graph replay vs the same builders run eagerly
(GPU only), as ``python -m staticattn bench`` measures it, per batch size.

Each timed step is ``GraphManager.run`` (validation, staging, then one replay or the eager
launches) followed by a device synchronize; DeepSeek-V4-like preset (1M context, next_n 2),
metadata only and with the built-in gather consumer.

    pytest benchmarks/test_bench_replay.py --benchmark-only --benchmark-group-by=param:num_reqs
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from staticattn.arena import ArenaConfig
from staticattn.bench.random_batches import NUM_KV_BLOCKS, random_uniform_decode
from staticattn.builders import IndexerMetadataBuilder, SparseSWAMetadataBuilder, make_arena
from staticattn.consumers.emulated.gather import GatherConsumer
from staticattn.graphs import EagerBuild, GraphManager, GraphOptions

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SIZES = [1, 8, 32, 128, 256]


@pytest.fixture(scope="module", params=["metadata", "gather"])
def manager(request):
    cfg = ArenaConfig.deepseek_v4()
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    step = GatherConsumer(cfg) if request.param == "gather" else (lambda batch, md: None)
    gm = GraphManager(arena, inputs, builders, step,
                      GraphOptions(progress=False, num_kv_blocks=NUM_KV_BLOCKS))
    gm.capture([b * cfg.next_n for b in SIZES], buckets=())
    yield request.param, gm
    gm.close()


@pytest.mark.parametrize("num_reqs", SIZES)
@pytest.mark.parametrize("path", ["graph", "eager"])
def test_step(benchmark, manager, num_reqs, path):
    consumer, gm = manager
    st = random_uniform_decode(gm.inputs, num_reqs, np.random.default_rng(num_reqs))
    args = (st.query_lens, st.seq_lens, st.slot_mapping)
    eager = EagerBuild.REFERENCE if path == "eager" else None

    def step():
        gm.run(*args, eager=eager)
        torch.cuda.synchronize()

    for _ in range(5):
        step()
    assert gm.run(*args, eager=eager).mode == path
    benchmark.extra_info.update(consumer=consumer, tokens=num_reqs * gm.config.next_n)
    benchmark(step)
