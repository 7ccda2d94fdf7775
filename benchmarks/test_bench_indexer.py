"""Indexer metadata per uniform decode step on the GPU: the eager build vs the replay of the
captured build, both including the input staging kernel and timed with host submit
(launch + ``torch.cuda.synchronize()``).

Run: ``pytest benchmarks/test_bench_indexer.py --benchmark-group-by=param:preset``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from staticattn.arena import ArenaConfig
from staticattn.builders import Batch, make_arena
from staticattn.builders.indexer.builder import IndexerMetadataBuilder

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SIZES = [1, 8, 32, 128, 256]
PRESETS = ["deepseek-v3.2", "deepseek-v4"]


def _setup(preset: str, size: int):
    """An arena for ``preset`` with ``size`` long decode requests staged and on the device."""
    cfg = ArenaConfig.preset(preset, max_num_seqs=256, max_model_len=131072)
    builder = IndexerMetadataBuilder()
    arena, inputs = make_arena(cfg, [builder])
    n = cfg.next_n
    rng = np.random.default_rng(size)
    lens = rng.integers(n, cfg.max_model_len + 1, size=size)
    table = rng.integers(1, 1 << 20, size=(size, cfg.max_blocks_per_req), dtype=np.int32)
    inputs.block_table[:size].copy_(torch.from_numpy(table))
    counts = inputs.stage(np.full(size, n), lens, np.arange(size * n))
    inputs.copy_to_device(size, size * n)
    torch.cuda.synchronize()
    return cfg, builder, inputs, Batch.from_staged(inputs, counts)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("preset", PRESETS)
def test_eager_build(benchmark, preset, size):
    cfg, builder, inputs, batch = _setup(preset, size)
    n = cfg.next_n

    def step():
        inputs.copy_to_device(size, size * n)
        builder.build(batch)
        torch.cuda.synchronize()

    benchmark.pedantic(step, rounds=200, warmup_rounds=10)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("preset", PRESETS)
def test_captured_replay(benchmark, preset, size):
    cfg, builder, inputs, _ = _setup(preset, size)
    n = cfg.next_n
    batch = Batch.for_decode_capture(inputs, size)

    def body():
        inputs.copy_to_device(size, size * n, uniform=True)
        builder.build_decode(batch)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()

    def replay():
        graph.replay()
        torch.cuda.synchronize()

    benchmark.pedantic(replay, rounds=500, warmup_rounds=20)
