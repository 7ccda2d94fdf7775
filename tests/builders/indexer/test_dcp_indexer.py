"""The indexer builder under decode context parallelism against the per-rank oracle
(``oracle/dcp.py``), on random realistic steps: world sizes 2 and 4, every rank, interleaves
that respect the compress ratio, next_n 1-3 (native, native MTP, flatten), the eager build
(decode, mixed with chunked prefills, prefill), the graph-safe decode build and the
graph-safe mixed build (prefill chunks planned on the device).

Each example stages one step on every rank's arena (each rank its own ``dcp_rank``, the same
global inputs) and checks each rank against the oracle, and the ranks against each other:
the local lengths add up to the global ones, and every compressed entry gets exactly one slot
over all ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.mixed_steps import bucket_for, stage_mixed
from helpers.op_trace import HOST_READS, OpTrace
from helpers.support import DEVICE, host_steps, index_ratio_fields, make_step, stage
from hypothesis import given, settings

from staticattn.arena import ArenaConfig
from staticattn.builders import Batch, make_arena
from staticattn.builders.indexer.builder import IndexerMetadataBuilder
from staticattn.builders.indexer.prefill import max_chunks
from staticattn.reference import dcp_indexer as oracle

# (world, index compress ratio, interleave, block size, next_n)
GRID = [
    (2, 1, 1, 64, 1), (2, 1, 16, 64, 2), (2, 4, 4, 256, 3), (2, 4, 64, 256, 1),
    (4, 1, 2, 64, 3), (4, 4, 8, 256, 2), (4, 4, 4, 64, 1),
]
GRID_IDS = [f"W{w}-R{r}-I{i}-bs{bs}-n{n}" for w, r, i, bs, n in GRID]

# Examples per grid point; each checks every rank (1,200 eager and 900 decode
# rank-batches on torch over the grid). Interpreted Triton is slow: fewer there.
EAGER_EXAMPLES = {"torch": 60, "triton": 15}
DECODE_EXAMPLES = {"torch": 45, "triton": 10}
MIXED_EXAMPLES = {"torch": 25, "triton": 6}


def _config(backend, world, rank, ratio, interleave, block_size, n):
    return ArenaConfig(
        max_num_seqs=16, max_num_batched_tokens=256, max_model_len=2048,
        block_size=block_size, num_speculative_tokens=n - 1, **index_ratio_fields(ratio),
        num_sms=7, max_prefill_workspace=1500, max_logits_bytes=4 * 12_000,
        dcp_world_size=world, dcp_rank=rank, cp_kv_cache_interleave_size=interleave,
        device=DEVICE, kernel_backend=backend,
    )


def _ranks(backend, world, ratio, interleave, block_size, n):
    """One (config, builder, arena, inputs) per rank."""
    out = []
    for rank in range(world):
        cfg = _config(backend, world, rank, ratio, interleave, block_size, n)
        builder = IndexerMetadataBuilder()
        arena, inputs = make_arena(cfg, [builder])
        out.append((cfg, builder, arena, inputs))
    return out


def _check_across_ranks(metas, step, ratio):
    """Local lengths add up to the global ones; each completed entry is written once."""
    decodes = [m.decode for m in metas]
    if decodes[0] is not None:
        total = sum(d.seq_lens for d in decodes)
        for d in decodes:
            assert torch.equal(total, d.global_seq_lens)
    written = sum((m.slot_mapping >= 0).long() for m in metas)
    qsl, seq_lens = step.query_start_loc, step.padded_seq_lens()
    completes = [0] * written.numel()  # tokens past the step's (padding, bucket) write none
    for b in range(step.num_reqs):
        q = qsl[b + 1] - qsl[b]
        for j in range(q):
            completes[qsl[b] + j] = int((seq_lens[b] - q + j + 1) % ratio == 0)
    assert written.tolist() == completes


@pytest.mark.parametrize(("world", "ratio", "interleave", "block_size", "n"), GRID,
                         ids=GRID_IDS)
def test_eager_build_matches_oracle_on_every_rank(backend, world, ratio, interleave,
                                                  block_size, n):
    ranks = _ranks(backend, world, ratio, interleave, block_size, n)

    @settings(max_examples=EAGER_EXAMPLES[backend])
    @given(host_steps(ranks[0][0]))
    def check(step):
        metas = []
        for rank, (cfg, builder, arena, inputs) in enumerate(ranks):
            meta = builder.build(stage(inputs, step))
            oracle.assert_matches(meta, oracle.indexer_metadata(cfg, step, rank), step, arena)
            metas.append(meta)
        _check_across_ranks(metas, step, ratio)

    check()


@pytest.mark.parametrize(("world", "ratio", "interleave", "block_size", "n"), GRID,
                         ids=GRID_IDS)
def test_decode_build_matches_oracle_on_every_rank(backend, world, ratio, interleave,
                                                   block_size, n):
    ranks = _ranks(backend, world, ratio, interleave, block_size, n)

    @settings(max_examples=DECODE_EXAMPLES[backend])
    @given(host_steps(ranks[0][0], kinds=("uniform_decode",)))
    def check(step):
        metas = []
        for rank, (cfg, builder, arena, inputs) in enumerate(ranks):
            stage(inputs, step)
            meta = builder.build_decode(Batch.for_decode_capture(inputs, step.num_reqs_padded))
            want = oracle.indexer_metadata(cfg, step, rank, graph=True)
            oracle.assert_matches(meta, want, step, arena)
            metas.append(meta)
        _check_across_ranks(metas, step, ratio)

    check()


def test_worked_example_localises_after_expansion():
    """World 2, rank 1, interleave 1, MTP (flattened) over the last 3 tokens of L = 10:
    global per-token [8, 9, 10] -> local [4, 4, 5] (not the [3, 4, 5] of expanding L's
    share)."""
    cfg = ArenaConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64,
                      block_size=16, num_speculative_tokens=2, dcp_world_size=2, dcp_rank=1,
                      device=DEVICE, kernel_backend="torch")
    builder = IndexerMetadataBuilder()
    _, inputs = make_arena(cfg, [builder])
    inputs.stage([3], [10], [0, 1, 2])
    inputs.copy_to_device(1, 3)
    meta = builder.build_decode(Batch.for_decode_capture(inputs, 1))
    assert meta.decode.global_seq_lens.tolist() == [[8], [9], [10]]
    assert meta.decode.seq_lens.tolist() == [[4], [4], [5]]


def test_compressed_entry_owner_example():
    """R = 4, I = 4, W = 2: position 7 completes entry 1, rank 1's first entry."""
    assert oracle.owner_of_entry(1, 4, 2, 4) == 1
    assert oracle.local_index(1, 4, 2, 4) == 0
    assert oracle.local_index(2, 4, 2, 4) == 1
    # The kernels' formulas (entry granularity J = I / R = 1) agree on the same entries.
    from staticattn.kernels.dcp.ownership import dcp_local_index, dcp_owner

    entries = torch.tensor([0, 1, 2, 3])
    assert dcp_owner(entries, 2, 1).tolist() == [oracle.owner_of_entry(e, 4, 2, 4)
                                                 for e in range(4)]
    assert dcp_local_index(entries, 2, 1).tolist() == [oracle.local_index(e, 4, 2, 4)
                                                       for e in range(4)]


@pytest.mark.parametrize(("world", "ratio", "interleave", "block_size", "n"), GRID,
                         ids=GRID_IDS)
def test_mixed_build_matches_oracle_on_every_rank(backend, world, ratio, interleave,
                                                  block_size, n):
    ranks = _ranks(backend, world, ratio, interleave, block_size, n)

    @settings(max_examples=MIXED_EXAMPLES[backend])
    @given(host_steps(ranks[0][0]))
    def check(step):
        num_reqs, num_tokens = bucket_for(ranks[0][0], step.num_tokens,
                                          np.random.default_rng(step.num_tokens))
        rows = max_chunks(ranks[0][0], num_reqs, num_tokens)
        metas = []
        for rank, (cfg, builder, _, inputs) in enumerate(ranks):
            meta = builder.build_mixed(stage_mixed(inputs, step, num_reqs, num_tokens))
            want = oracle.mixed_indexer(cfg, step, rank, num_reqs, num_tokens, rows)
            oracle.assert_mixed_matches(meta, want, cfg, step)
            metas.append(meta)
        _check_across_ranks(metas, step, ranks[0][0].index_compress_ratio)

    check()


@pytest.mark.parametrize("build", ["build_decode", "build_mixed"])
def test_torch_graph_safe_builds_read_nothing_back_under_dcp(build):
    """The rank is a static int: the graph-safe builds of a DCP rank run the same torch ops
    whatever the data, and none of them reads the device back."""
    cfg = _config("torch", 2, 1, 4, 4, 256, 2)
    builder = IndexerMetadataBuilder()
    _, inputs = make_arena(cfg, [builder])

    def run(lens):
        step = make_step(cfg, [2, 2], lens, num_reqs_padded=3, num_tokens_padded=6)
        if build == "build_decode":
            stage(inputs, step)
            return builder.build_decode(Batch.for_decode_capture(inputs, 3))
        return builder.build_mixed(stage_mixed(inputs, step, 4, 8))

    run([9, 9])  # cuts and keeps the views of this size
    traces = []
    for lens in ([3, 4], [2000, 1500]):
        with OpTrace() as trace:
            run(lens)
        traces.append(trace.ops)
    assert not HOST_READS & set(traces[0])
    assert traces[0] == traces[1]
