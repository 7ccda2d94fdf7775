"""The SWA + dense decode build: eager vs captured replay, per batch size (GPU only).

Both sides do the same device work, staging included: the staging kernel then the build's
one kernel, eagerly (two launches and the host work of ``build``) or as one graph replay.
DeepSeek-V4-like preset: 1M context (dense rows of 8192 entries), next_n = 2, window 128.

    pytest benchmarks/test_bench_swa.py --benchmark-only --benchmark-group-by=param:num_reqs
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from staticattn.arena import ArenaConfig
from staticattn.builders import Batch, make_arena
from staticattn.builders.swa.builder import SparseSWAMetadataBuilder

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SIZES = [1, 8, 32, 128, 256]


@pytest.fixture(scope="module")
def v4():
    cfg = ArenaConfig.deepseek_v4()
    builder = SparseSWAMetadataBuilder()
    _, inputs = make_arena(cfg, [builder])
    return cfg, builder, inputs


def _stage_decode(cfg, inputs, num_reqs: int):
    """``num_reqs`` MTP decodes at long random lengths, block rows written in place."""
    rng = np.random.default_rng(num_reqs)
    for table in (inputs.block_table, inputs.swa_block_table):
        rows = rng.integers(1, 1 << 20, (num_reqs, table.shape[1]), dtype=np.int32)
        table[:num_reqs].copy_(torch.from_numpy(rows))
    seq_lens = rng.integers(cfg.max_model_len // 2, cfg.max_model_len + 1, num_reqs)
    # Slots only need to be valid (>= 0): the build reads their sign, not their value.
    slots = np.arange(num_reqs * cfg.next_n)
    return inputs.stage(np.full(num_reqs, cfg.next_n), seq_lens, slots)


@pytest.mark.parametrize("num_reqs", SIZES)
def test_eager_build(benchmark, v4, num_reqs):
    cfg, builder, inputs = v4
    counts = _stage_decode(cfg, inputs, num_reqs)
    batch = Batch.from_staged(inputs, counts)

    def step():
        inputs.copy_to_device(counts.num_reqs, counts.num_tokens)
        builder.build(batch)
        torch.cuda.synchronize()

    step()  # compile
    benchmark.extra_info["tokens"] = counts.num_tokens
    benchmark(step)


@pytest.mark.parametrize("num_reqs", SIZES)
def test_graph_replay(benchmark, v4, num_reqs):
    cfg, builder, inputs = v4
    counts = _stage_decode(cfg, inputs, num_reqs)
    batch = Batch.for_decode_capture(inputs, num_reqs)

    def body():
        inputs.copy_to_device(num_reqs, batch.num_actual_tokens, uniform=True)
        builder.build_decode(batch)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        body()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()

    def step():
        graph.replay()
        torch.cuda.synchronize()

    benchmark.extra_info["tokens"] = counts.num_tokens
    benchmark(step)
