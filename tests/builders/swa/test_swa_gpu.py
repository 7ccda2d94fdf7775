"""On the GPU: staging + the SWA/dense decode build captured as one CUDA graph, captured with
short sequences and replayed over randomized long ones, equals the eager build and the oracle
every time; the build is one kernel node, creates no tensor and never syncs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from helpers.support import make_step

from staticattn.arena import ArenaConfig
from staticattn.builders import Batch, make_arena
from staticattn.builders.swa.builder import SparseSWAMetadataBuilder
from staticattn.checks import check_graph_safety
from staticattn.checks.guarded_capture import sync_guard
from staticattn.checks.watch import CaptureWatch
from staticattn.consumers.emulated.gather import GatherConsumer
from staticattn.graphs.introspect import new_graph, node_census
from staticattn.graphs.python_gc import gc_paused
from staticattn.reference.swa import assert_matches, expected_for_step

pytestmark = pytest.mark.gpu

NUM_BATCHES = 500


def _setup(backend: str):
    # maxC = 256 dense columns, next_n = 2, SWA window 128 on 64-token blocks.
    cfg = ArenaConfig.deepseek_v4(max_model_len=32768, max_num_seqs=16,
                                  max_num_batched_tokens=512, kernel_backend=backend)
    builder = SparseSWAMetadataBuilder()
    arena, inputs = make_arena(cfg, [builder])
    return cfg, builder, arena, inputs


def _random_step(cfg, size, rng, *, short=False):
    """1..size uniform decode requests padded to ``size``; ~10% of tokens with slot -1."""
    n = cfg.next_n
    k = int(rng.integers(1, size + 1))
    seq_lens = rng.integers(n, (2 * n if short else cfg.max_model_len) + 1, size=k)
    invalid = np.flatnonzero(rng.random(k * n) < 0.1)
    return make_step(cfg, [n] * k, seq_lens, num_reqs_padded=size, num_tokens_padded=size * n,
                     invalid_tokens=invalid, rng=rng)


def _stage_host(inputs, step):
    """The engine's part: block-table rows in place (padded requests on the null block),
    then the small inputs into pinned staging. No device work is launched."""
    r, size = step.num_reqs, step.num_reqs_padded
    for table, rows in ((inputs.block_table, step.block_table),
                        (inputs.swa_block_table, step.swa_block_table)):
        table[:r].copy_(torch.from_numpy(rows))
        table[r:size].zero_()
    return inputs.stage(step.query_lens, step.seq_lens, step.slot_mapping,
                        num_reqs_padded=size, num_tokens_padded=step.num_tokens_padded)


def _warm_up(fn):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # compiles the Triton kernels outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()


def _capture(builder, inputs, size):
    """One graph = staging kernel + ``build_decode``; returns it and the captured metadata."""
    batch = Batch.for_decode_capture(inputs, size)

    def body():
        inputs.copy_to_device(size, batch.num_actual_tokens)
        return builder.build_decode(batch)

    _warm_up(body)
    graph = torch.cuda.CUDAGraph()
    with gc_paused(), torch.cuda.graph(graph):
        meta = body()
    return graph, meta


def _allocations() -> int:
    return torch.cuda.memory_stats()["allocation.all.allocated"]


def _tensor_names(meta) -> list[str]:
    return [f.name for f in dataclasses.fields(meta)
            if isinstance(getattr(meta, f.name), torch.Tensor)]


def _snapshot(meta):
    """The metadata with every tensor cloned: the next build rewrites the same views."""
    return dataclasses.replace(meta, **{k: getattr(meta, k).clone() for k in _tensor_names(meta)})


def _assert_same(a, b) -> None:
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor):
            assert x.shape == y.shape and torch.equal(x, y), f.name
        elif f.name.startswith("tile_sched"):
            assert (x is None) == (y is None), f.name
        else:
            assert x == y, f.name


@pytest.mark.parametrize("size", [1, 7, 16])
def test_replay_equals_eager_and_oracle(backend, size):
    cfg, builder, arena, inputs = _setup(backend)
    rng = np.random.default_rng(size)
    _stage_host(inputs, _random_step(cfg, size, rng, short=True))  # capture short
    graph, meta = _capture(builder, inputs, size)
    fingerprint = arena.fingerprint()
    for _ in range(NUM_BATCHES):  # replay long
        step = _random_step(cfg, size, rng)
        _stage_host(inputs, step)
        allocations = _allocations()
        graph.replay()
        assert _allocations() == allocations
        replayed = _snapshot(meta)
        assert_matches(replayed, expected_for_step(cfg, step))
        counts = _stage_host(inputs, step)
        inputs.copy_to_device(counts.num_reqs_padded, counts.num_tokens_padded)
        _assert_same(replayed, builder.build(Batch.from_staged(inputs, counts)))
    assert arena.fingerprint() == fingerprint


def test_decode_build_is_one_kernel_node():
    cfg, builder, _, inputs = _setup("triton")
    size = 8
    _stage_host(inputs, _random_step(cfg, size, np.random.default_rng(0)))
    inputs.copy_to_device(size, size * cfg.next_n)
    batch = Batch.for_decode_capture(inputs, size)
    _warm_up(lambda: builder.build_decode(batch))
    graph = new_graph()
    with gc_paused(), torch.cuda.graph(graph):
        builder.build_decode(batch)
    census = node_census(graph)
    if census is None:
        pytest.skip("the node census needs cuda-bindings and CUDAGraph(keep_graph=True)")
    assert census.get("kernel", 0) <= 2, f"launch budget is 2 kernels: {census}"
    assert census == {"kernel": 1}, f"designed as exactly one kernel: {census}"


def test_capture_creates_no_tensor_and_never_syncs():
    cfg, builder, _, inputs = _setup("triton")
    size = 4
    _stage_host(inputs, _random_step(cfg, size, np.random.default_rng(1)))
    inputs.copy_to_device(size, size * cfg.next_n)
    batch = Batch.for_decode_capture(inputs, size)
    _warm_up(lambda: builder.build_decode(batch))
    watch = CaptureWatch()
    graph = torch.cuda.CUDAGraph()
    with gc_paused(), torch.cuda.graph(graph), sync_guard(), watch:
        builder.build_decode(batch)
    assert watch.fresh == {}
    # Views only: no aten op that could launch a kernel besides the one Triton launch.
    assert set(watch.ops) <= {"slice", "select", "alias", "view", "as_strided"}, watch.ops


def test_graph_checker_passes_with_a_consumer():
    cfg, builder, arena, inputs = _setup("triton")
    report = check_graph_safety(arena, inputs, [builder], GatherConsumer(cfg),
                                sizes=[2, 16, 32], num_batches=100)
    assert report.ok, str(report)
