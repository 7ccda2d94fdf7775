"""One PCP rank's graph on one device: with ``P = 1`` the rank holds both chunks of every
prefill and the all-gathers are the identity, so a single process captures (CUDA: V3.2 and
V4.1, whose PCP the reference runs eagerly only) or runs (CPU) the whole body -- the staged
global batch's copy, the split (V4.1: with the ring links), the rank's input views, the
builders' mixed builds, the emulated layer and the restore -- and every step must equal the
single-GPU step, its metadata the oracle. Graph-safety (no host read, no allocation outside
the pool, no branch on data) is what the CUDA capture checks; on the CPU the body's ops are
traced instead: none reads the device back, and two different steps run the same ops."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from helpers import compressor_oracle
from helpers.op_trace import HOST_READS, OpTrace

from staticattn.arena.pcp_config import GraphMode
from staticattn.distributed.pcp_world import (
    PCPSizes,
    next_pcp_step,
    pcp_pair,
    random_pcp_step,
    rank_mismatches,
    ring_rows,
)
from staticattn.errors import CapacityError, ConfigError, InvalidBatchError

SIZES = PCPSizes(max_num_seqs=4, max_num_tokens=96, max_model_len=512)


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(("preset", "speculative"),
                         [("deepseek-v3.2", 0), ("deepseek-v3.2", 1), ("deepseek-v4.1-flash", 0)])
def test_the_rank_step_equals_the_single_gpu_step(preset, speculative):
    """Both in a graph on CUDA (V4.1 on purpose: the reference runs its PCP eagerly); the
    steps continue their requests half the time (V4.1: the compressor ring read back). V3.2
    also with single-module MTP: decode rows of 1 or 2 tokens."""
    rng = np.random.default_rng(3)
    step = None
    sizes = dataclasses.replace(SIZES, num_speculative_tokens=speculative)
    with pcp_pair(preset, 1, 0, None, _device(), sizes) as pair:
        assert pair.rank.graphs == torch.cuda.is_available()
        assert (pair.rank.views.ring is not None) == (preset == "deepseek-v4.1-flash")
        if pair.rank.graphs:
            pair.rank.capture()
            assert pair.rank.graph is not None
        for _ in range(25 if torch.cuda.is_available() else 8):
            step = next_pcp_step(rng, sizes, pair.columns, step)
            pair.write(step)
            got = pair.run(step).clone()
            assert torch.equal(got, pair.run_single(step)), step
            assert rank_mismatches(pair, step) == [], step


def test_the_v41_compressor_column_follows_the_ring_over_continued_steps():
    """The emulated compressor's column (the rank's, in its graph on CUDA, and the
    single-GPU step's) equals the oracle's over a run whose steps continue their requests:
    tokens that close a group their request's previous step left open read it back from
    the compressor ring."""
    rng, step, steps, got = np.random.default_rng(9), None, [], []
    with pcp_pair("deepseek-v4.1-flash", 1, 0, None, _device(), SIZES) as pair:
        if pair.rank.graphs:
            pair.rank.capture()
        for _ in range(10):
            step = next_pcp_step(rng, SIZES, pair.columns, step)
            pair.write(step)
            got.append(pair.run(step)[:, -1].tolist())
            assert pair.run_single(step)[:, -1].tolist() == got[-1]
            steps.append({**step, "table": ring_rows(step["table"]).tolist()})
    assert compressor_oracle.ring_reads(steps, 1), "no step read the ring back"
    assert got == compressor_oracle.compressed_values(steps)


def test_the_v41_rank_body_reads_nothing_back_and_runs_the_same_ops():
    """What the graph holds for V4.1 (the split, the ring links, the rank's inputs, the
    builders' mixed builds, the emulated layer), traced on the CPU: no op reads the device
    back and, once warm, two different steps run the same ops."""
    rng = np.random.default_rng(11)
    traces = []
    with pcp_pair("deepseek-v4.1-flash", 1, 0, None, "cpu", SIZES) as pair:
        for _ in range(3):
            step = random_pcp_step(rng, SIZES, pair.columns)
            pair.write(step)
            pair.rank.stage(step["query_lens"], step["is_prefilling"], step["num_computed"],
                            step["req_state_idx"])
            with OpTrace() as trace:
                pair.rank.body()
            traces.append(trace.ops)
    assert not HOST_READS & set(traces[0])
    assert traces[1] == traces[2]  # the first call also builds what stays (views, plans)


def test_a_v41_rank_runs_eagerly_when_asked():
    with pcp_pair("deepseek-v4.1-flash", 1, 0, None, _device(), SIZES, eager=True) as pair:
        assert pair.rank.pcp.graph_mode is GraphMode.NONE and not pair.rank.graphs
        with pytest.raises(ConfigError, match="a PCP graph mode"):
            pair.rank.capture()
        step = random_pcp_step(np.random.default_rng(4), SIZES, pair.columns)
        pair.write(step)
        assert torch.equal(pair.run(step), pair.run_single(step))
        assert rank_mismatches(pair, step) == []


@pytest.mark.parametrize(("change", "error", "says"), [
    (dict(query_lens=[3, 1], is_prefilling=[False, True]), InvalidBatchError,
     "not prefilling but schedules 3 tokens"),
    (dict(query_lens=[1, 200]), CapacityError, "global token capacity 96"),
    (dict(num_computed=[0, 512]), CapacityError, "max_model_len=512"),
])
def test_a_bad_step_is_a_typed_error_before_anything_is_written(change, error, says):
    with pcp_pair("deepseek-v3.2", 1, 0, None, "cpu", SIZES) as pair:
        step = random_pcp_step(np.random.default_rng(0), SIZES, pair.columns, num_reqs=2)
        step.update(change)
        before = pair.rank.arena.block("device").clone(), pair.rank.views.host_batch.clone()
        with pytest.raises(error, match=says):
            pair.run(step)
        assert torch.equal(pair.rank.arena.block("device"), before[0])
        assert torch.equal(pair.rank.views.host_batch, before[1])


@pytest.mark.parametrize(("rank_arena", "says"), [
    (dict(max_num_seqs=4), "must hold 8 rows and 60 tokens"),
    (dict(max_num_batched_tokens=32), "must hold 8 rows and 60 tokens"),
    (dict(dcp_world_size=2, dcp_rank=0), "with an arena of the same dcp_world_size"),
    (dict(num_speculative_tokens=1), "need speculation MTP"),
])
def test_a_rank_arena_that_cannot_hold_the_split_is_refused(rank_arena, says):
    from staticattn.arena import ArenaConfig
    from staticattn.arena.pcp_config import PCPConfig
    from staticattn.distributed.pcp_rank import PCPRank

    pcp = PCPConfig(pcp_size=2, max_num_seqs=4)
    cfg = ArenaConfig.preset("deepseek-v3.2", device="cpu", max_model_len=512,
                             **{"max_num_seqs": 8, "max_num_batched_tokens": 64, **rank_arena})
    with pytest.raises(ConfigError, match=says):
        PCPRank(pcp, cfg, 60, 96, None, 0, num_kv_blocks=33)
