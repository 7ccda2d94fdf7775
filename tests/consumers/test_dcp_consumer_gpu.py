"""On one GPU: the DCP consumer at world 1 (the single-GPU step the ranks are compared with;
for DeepSeek V4.1 one per index type, attending through the compressed builder's operand)
is graph-safe -- captured with the build in the decode graphs, every replay equals the same
step run eagerly -- and the checker passes it. With two GPUs the ranks run it under NCCL
(``tests/distributed/test_dcp_demo.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from staticattn.checks import check_graph_safety
from staticattn.distributed.world import (
    dcp_config,
    dcp_world,
    kv_pool_blocks,
    random_decode_step,
    write_decode_step,
)
from staticattn.graphs import EagerBuild, GraphManager, GraphOptions

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("preset", ["deepseek-v4", "deepseek-v3.2", "deepseek-v4.1-flash"])
def test_replays_equal_the_eager_step(preset):
    cfg = dcp_config(preset, 1, 0, "cuda")
    arena, inputs, builders, consumer = dcp_world(cfg, None)
    rng = np.random.default_rng(0)
    options = GraphOptions(progress=False, num_kv_blocks=kv_pool_blocks(cfg))
    with GraphManager(arena, inputs, builders, consumer, options) as gm:
        gm.capture(buckets=())
        fingerprint = arena.fingerprint()
        for _ in range(200):
            step = random_decode_step(cfg, rng)
            write_decode_step(inputs, consumer, step)
            lengths = (step["query_lens"], step["seq_lens"], step["slot_mapping"])
            res = gm.run(*lengths)
            assert res.mode == "graph"
            got = [x.clone() for x in res.outputs]
            want = gm.run(*lengths, eager=EagerBuild.REFERENCE).outputs
            assert len(got) == len(want)
            for ids, want_ids, out, want_out in zip(got[::2], want[::2], got[1::2], want[1::2]):
                assert torch.equal(ids, want_ids)  # per index type: (ids, out)
                torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-6)
        assert arena.fingerprint() == fingerprint


def test_the_checker_passes_it():
    cfg = dcp_config("deepseek-v4", 1, 0, "cuda")
    arena, inputs, builders, consumer = dcp_world(cfg, None)
    write_decode_step(inputs, consumer, random_decode_step(cfg, np.random.default_rng(1)))
    # The checker's random block ids stay within the consumer's caches.
    blocks = consumer.index_cache.shape[0] // consumer.per_block
    report = check_graph_safety(arena, inputs, builders, consumer, sizes=[2, 32],
                                num_batches=10, num_kv_blocks=blocks)
    assert report.ok, str(report)
