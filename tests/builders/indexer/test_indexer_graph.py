"""On the GPU: the indexer's decode build captured in one CUDA graph together with the input
staging, replayed over randomized batches of the captured size (captured with short
sequences, replayed with long ones), equal to the eager build and the oracle every time; the
kernel budget of the captured build; the eager build of mixed steps with compiled Triton."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.support import host_steps, index_ratio_fields, make_step, stage
from hypothesis import given, settings

from staticattn.arena import ArenaConfig
from staticattn.builders import Batch, make_arena
from staticattn.builders.indexer.builder import IndexerMetadataBuilder
from staticattn.graphs.python_gc import gc_paused
from staticattn.kernels.indexer.mqa_schedule import paged_mqa_schedule
from staticattn.reference import indexer as oracle

pytestmark = pytest.mark.gpu

S = 16  # requests in the captured step
CASES = [(1, 1, 64), (2, 1, 64), (4, 1, 64), (1, 4, 256), (2, 4, 256), (4, 4, 256)]
CASE_IDS = [f"n{n}-R{r}-bs{bs}" for n, r, bs in CASES]


def _setup(n, ratio, block_size, backend="triton"):
    cfg = ArenaConfig(
        max_num_seqs=64, max_num_batched_tokens=512, max_model_len=16384,
        block_size=block_size, num_speculative_tokens=n - 1, **index_ratio_fields(ratio),
        max_prefill_workspace=3000, max_logits_bytes=4 * 50_000,
        device="cuda", kernel_backend=backend,
    )
    builder = IndexerMetadataBuilder()
    arena, inputs = make_arena(cfg, [builder])
    return cfg, builder, arena, inputs


def _stage_uniform(inputs, rng, k, short=False):
    """k real requests of next_n tokens padded to S; block-table rows written in place
    (padded rows to the null block), small inputs through the host staging."""
    cfg = inputs.config
    n = cfg.next_n
    if short:
        lens = np.full(k, n)
    else:
        long = rng.integers(n, cfg.max_model_len + 1, size=k)
        lens = np.where(rng.random(k) < 0.3, rng.integers(n, n + 300, size=k), long)
    step = make_step(cfg, [n] * k, lens, num_reqs_padded=S, num_tokens_padded=S * n, rng=rng)
    inputs.block_table[:k].copy_(torch.from_numpy(step.block_table))
    inputs.block_table[k:S].zero_()
    counts = inputs.stage(step.query_lens, step.seq_lens, step.slot_mapping,
                          num_reqs_padded=S, num_tokens_padded=S * n)
    return step, counts


def _capture(inputs, builder):
    """One graph: staging kernel + decode build, after a warm-up on a side stream."""
    n = inputs.config.next_n
    batch = Batch.for_decode_capture(inputs, S)
    captured = {}

    def body():
        inputs.copy_to_device(S, S * n)
        captured["meta"] = builder.build_decode(batch)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body()  # compiles every kernel outside the capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with gc_paused(), torch.cuda.graph(graph):  # ends the capture even if body() raises
        body()
    torch.cuda.synchronize()
    return graph, captured["meta"]


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize(("n", "ratio", "block_size"), CASES, ids=CASE_IDS)
def test_replay_equals_eager_and_oracle(backend, n, ratio, block_size):
    cfg, builder, arena, inputs = _setup(n, ratio, block_size, backend)
    rng = np.random.default_rng(n * 10 + ratio)
    _stage_uniform(inputs, rng, S, short=True)  # capture at minimal sequence lengths
    graph, meta = _capture(inputs, builder)
    before = arena.fingerprint()
    for _ in range(500):
        step, counts = _stage_uniform(inputs, rng, int(rng.integers(1, S + 1)))
        graph.replay()
        torch.cuda.synchronize()
        replayed = oracle.decode_values(meta)
        oracle.assert_matches(meta, oracle.indexer_metadata(cfg, step, graph=True), step,
                              arena)
        eager = builder.build(Batch.from_staged(inputs, counts))
        torch.cuda.synchronize()
        assert oracle.decode_values(eager) == replayed
    assert arena.fingerprint() == before


@pytest.mark.parametrize(("n", "ratio", "block_size"), CASES, ids=CASE_IDS)
def test_replay_allocates_nothing(n, ratio, block_size):
    cfg, builder, arena, inputs = _setup(n, ratio, block_size)
    rng = np.random.default_rng(0)
    _stage_uniform(inputs, rng, S, short=True)
    graph, _ = _capture(inputs, builder)
    _stage_uniform(inputs, rng, S)
    graph.replay()
    torch.cuda.synchronize()
    stats0 = torch.cuda.memory_stats()
    for _ in range(50):
        _stage_uniform(inputs, rng, int(rng.integers(1, S + 1)))
        graph.replay()
    torch.cuda.synchronize()
    stats1 = torch.cuda.memory_stats()
    for key in ("allocation.all.allocated", "allocated_bytes.all.allocated"):
        assert stats1[key] == stats0[key], key


def _graph_kernel_nodes(fn) -> int | None:
    """Kernel nodes of a graph capturing ``fn``, through cuda-bindings; None if this torch or
    cuda-bindings cannot show them."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        return None
    try:
        graph = torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError:
        return None
    if not hasattr(graph, "raw_cuda_graph"):
        return None
    with gc_paused(), torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    as_int = lambda v: int(getattr(v, "value", v))
    try:
        handle = cudart.cudaGraph_t(init_value=int(graph.raw_cuda_graph()))
        count = cudart.cudaGraphGetNodes(handle, 0)[-1]
        err, nodes, _ = cudart.cudaGraphGetNodes(handle, count)
        if as_int(err) != 0:
            return None
        kernel = as_int(cudart.cudaGraphNodeType.cudaGraphNodeTypeKernel)
        return sum(as_int(cudart.cudaGraphNodeGetType(node)[1]) == kernel for node in nodes)
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return None


def _profiled_kernels(fn) -> int:
    """Kernels the profiler sees in one eager call of ``fn``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(e.device_type == torch.autograd.DeviceType.CUDA
               and not e.name.startswith(("Memcpy", "Memset")) for e in prof.events())


def _kernels(fn) -> int:
    fn()  # warm-up: compile outside any capture
    torch.cuda.synchronize()
    counted = _graph_kernel_nodes(fn)
    return _profiled_kernels(fn) if counted is None else counted


@pytest.mark.parametrize(("n", "ratio", "block_size"), CASES, ids=CASE_IDS)
def test_decode_build_kernel_budget(n, ratio, block_size):
    """Without the schedule the captured decode build is one kernel: the decode tensors and,
    when R > 1, the compressed slot mapping in the same launch; the schedule is 1 more."""
    cfg, builder, arena, inputs = _setup(n, ratio, block_size)
    _stage_uniform(inputs, np.random.default_rng(1), S)
    inputs.copy_to_device(S, S * n)
    batch = Batch.for_decode_capture(inputs, S)
    total = _kernels(lambda: builder.build_decode(batch))
    lens = builder.decode_seq_lens[:S].view(S, 1)
    schedule = _kernels(lambda: paged_mqa_schedule("triton", lens, builder.schedule_metadata))
    assert schedule == 1
    assert total - schedule <= 2
    assert total == 2


@pytest.mark.parametrize(("n", "ratio", "block_size"), CASES, ids=CASE_IDS)
def test_eager_mixed_steps_on_gpu_match_oracle(n, ratio, block_size):
    cfg, builder, arena, inputs = _setup(n, ratio, block_size)

    @settings(max_examples=25)
    @given(host_steps(cfg, max_reqs=32))
    def check(step):
        meta = builder.build(stage(inputs, step))
        torch.cuda.synchronize()
        oracle.assert_matches(meta, oracle.indexer_metadata(cfg, step), step, arena)

    check()
