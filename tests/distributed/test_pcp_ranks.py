"""The demo's path across processes: 2 and 4 ranks joined by gloo on CPU (and, with enough
GPUs, NCCL with each rank's graph captured), every rank building its rows from the same
global steps, the KV replicated (PCP alone) or sharded over the same ranks (PCP + DCP).
Per step and rank, what the rank's builders read (its input views: query starts, lengths,
positions, slots, block rows, the decode/prefill split) equals the single-process oracle
(:mod:`staticattn.reference.pcp_layout`), and the rank's restored rows (every token's
checksums through the rank's metadata, after the all-gathered KV writes) equal the
single-GPU step's."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
import torch.distributed as dist
from helpers import compressor_oracle, dcp_workers, pcp_workers

from staticattn.arena.pcp_config import PCPConfig
from staticattn.distributed import pcp_world
from staticattn.reference import pcp_layout as pcp

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="needs torch.distributed with gloo")

BLOCK_SIZE = 64


def _check(records: list[dict], world: int, dcp: int = 1, interleave: int = 1,
           v41: bool = False, max_num_seqs: int = 4) -> None:
    cfg = PCPConfig(pcp_size=world, dcp_size=dcp, max_num_seqs=max_num_seqs,
                    cp_kv_cache_interleave_size=interleave,
                    architecture="deepseek_v41" if v41 else "deepseek_v32")
    # The batch's slots: V4.1's are its window group's (32-token blocks).
    slot_cfg = dataclasses.replace(cfg, block_size=32) if v41 else cfg
    prefills = 0
    compressed = compressor_oracle.compressed_values(
        [{**r["step"], "table": pcp_world.ring_rows(r["step"]["table"]).tolist()}
         for r in records[0]["steps"]])
    for s, per_rank in enumerate(zip(*(r["steps"] for r in records))):
        step = per_rank[0]["step"]
        batch = pcp.GlobalBatch(step["query_lens"], step["num_computed"],
                                step["is_prefilling"], step["req_state_idx"], step["table"])
        N = per_rank[0]["N"]
        lay = pcp.layout(cfg, batch, N)
        prefills += sum(batch.is_prefilling)
        for p, got in enumerate(per_rank):
            slots = pcp.gathered_slots(slot_cfg, batch, lay, cfg.dcp_rank(p))
            assert got["step"] == step, "every rank draws the same step"
            assert got["equal"], f"step {s} rank {p}: restored rows differ from one GPU's"
            assert got["tail_zero"], f"step {s} rank {p}: rows past the step's tokens"
            meta = pcp.rank_metadata(cfg, batch, lay, p, cfg.dcp_rank(p))
            rows = lay.rows[p]
            n, R = len(rows), cfg.max_rows
            assert got["query_start_loc"] == meta["query_start_loc"] + [
                lay.num_tokens[p]] * (R - n), (s, p)
            assert got["seq_lens"] == meta["seq_lens"] + [0] * (R - n), (s, p)
            assert got["positions"] == meta["positions"], (s, p)
            assert got["slot_mapping"] == slots[p * N:(p + 1) * N], (s, p)
            assert got["block_table"] == [step["table"][r.req][:2] for r in rows] + [
                [0] * 2] * (R - n), (s, p)
            decodes = sum(not batch.is_prefilling[r.req] for r in rows if r.length)
            assert got["step_counts"] == [n, lay.num_tokens[p], decodes,
                                          meta["query_start_loc"][decodes]], (s, p)
            if v41:
                # The demo's V4.1 takes no speculative tokens (§4.2).
                ring = pcp_world.ring_rows(step["table"]).tolist()
                assert pcp_world.expected_ring_links(cfg, batch, lay, ring, 0) == (
                    got["prev_row_indices"], got["ring_write_slots"]), (s, p)
                assert got["compressor"] == compressed[s], (s, p)
                assert got["ring_equal"], f"step {s} rank {p}: ring differs from one GPU's"
            else:
                assert got["prev_row_indices"] is None, "V3.2 has no compressor ring"
                assert got["compressor"] is None
    assert prefills >= len(records[0]["steps"]) // 2  # the steps held prefills to split


@pytest.mark.parametrize(("world", "dcp", "interleave", "speculative"),
                         [(2, 1, 1, 1), (4, 1, 1, 0), (2, 2, 8, 1)])
def test_gloo_ranks_build_the_oracle_rows_and_the_single_gpu_step(tmp_path, world, dcp,
                                                                  interleave, speculative):
    """PCP alone on 2 and 4 ranks; PCP + DCP (the KV sharded over the same 2 ranks, 8
    tokens dealt at a time), where a rank's slots are those of its DCP shard and its
    restored rows come through the global prefill plan and the decode rows' reduction.
    On 2 ranks with single-module MTP: decode rows of 1 or 2 tokens, whole on the rank that
    owns them (every rank under DCP), beside prefills of 1 or 2 tokens that the single GPU
    builds as decodes."""
    target = functools.partial(pcp_workers.demo_steps, world=world, dcp=dcp,
                               interleave=interleave, speculative=speculative)
    records = dcp_workers.spawn_ranks(target, tmp_path, world)
    _check(records, world, dcp, interleave)
    if speculative:
        steps = [r["step"] for r in records[0]["steps"]]
        assert any(q == 2 and not pre for s in steps
                   for q, pre in zip(s["query_lens"], s["is_prefilling"])), "no 2-token decode"


@pytest.mark.parametrize("world", [2, 4])
def test_gloo_ranks_serve_deepseek_v41(tmp_path, world):
    """DeepSeek V4.1 (the KV replicated): its two indexers, compressed KV with the ratio-2
    compressor ring, and the window; the keys all-gathered into the window's cache. Every
    rank's ring links, built in its step from the staged batch, equal the oracle's; the
    emulated compressor's column (each token's 2-token group, its first half through a link
    or the ring) equals the single-GPU step's and the oracle's, and every rank's ring the
    single-GPU step's. The steps hold rows that link across the ranks, rows that save an
    open group, and requests continued from an open group, on rank 0 (a prefill's first
    chunk) and on another rank (a decode it owns)."""
    # Seed 9's ten steps continue requests from open groups on ranks 0 and 1 (and 2 of 4).
    target = functools.partial(pcp_workers.demo_steps, world=world,
                               preset="deepseek-v4.1-flash", steps=10, seed=9)
    records = dcp_workers.spawn_ranks(target, tmp_path, world)
    _check(records, world, v41=True)
    steps = records[0]["steps"]
    assert any(p >= 0 for s in steps for rank in s["prev_row_indices"] for p in rank)
    assert any(w >= 0 for s in steps for w in s["ring_write_slots"])
    readers = {rank for _, rank in compressor_oracle.ring_reads([s["step"] for s in steps],
                                                                world)}
    assert 0 in readers and readers - {0}, readers


def test_gloo_ranks_link_the_ring_of_worked_example_4(tmp_path):
    """§4.2's worked example 4 on four V4.1 ranks: q = (37, 100), ring blocks A -> 5 and
    B -> 9, ``max_num_seqs = 4`` (R = 8 rows a rank, gathered row ``rank * 8 + row``)."""
    records = dcp_workers.spawn_ranks(pcp_workers.ring_example, tmp_path, 4)
    _check(records, 4, v41=True)
    pad = [-1] * 4
    key = compressor_oracle.key
    for record in records:
        got, after = record["steps"]
        assert got["prev_row_indices"] == [[-1, 9, -1, 11] + pad, [0, -1, 2, -1] + pad,
                                           [-1, 25, -1, 27] + pad, [16, -1, 18, -1] + pad]
        assert got["ring_write_slots"] == [-1, 44] + [-1] * 30
        # A's token 35 opens rank 0's row A[35, 37): its first half, key 34, comes through
        # the link to gathered row 9; B's 91 opens rank 0's B[91, 100), key 90 from row 11.
        assert got["compressor"][35] == key(3, 34) << 20 | key(3, 35)
        assert got["compressor"][37 + 91] == key(7, 90) << 20 | key(7, 91)
        assert got["compressor"][36] == -1
        # The next step: A's 37 reads key 36 from ring slot 44, where every rank saved it
        # (and A's 44 saves there again, after the read); B starts at even 100.
        assert after["compressor"][0] == key(3, 36) << 20 | key(3, 37)
        assert after["ring_write_slots"].count(-1) == 30  # A ends at 44, B at 120: both open


def _r(a: int, b: int) -> list[int]:
    """``a..b`` inclusive, as the spec writes ranges."""
    return list(range(a, b + 1))


#: Worked example 1 (P = 2): per rank, its rows' query starts and lengths and its segment of
#: the gathered slot mapping (the spec's N = 70; past a rank's tokens, -1).
EXAMPLE_1 = {0: ([0, 10, 17, 42, 67], [10, 37, 25, 100],
                 _r(640, 649) + _r(670, 676) + _r(1280, 1304) + _r(1355, 1379)),
             1: ([0, 10, 20, 45, 70], [20, 30, 50, 75], _r(650, 669) + _r(1305, 1354))}


@pytest.mark.parametrize(("world", "dcp"), [(2, 1), (2, 2)])
def test_gloo_ranks_build_worked_examples_1_and_2(tmp_path, world, dcp):
    """§2.4's fresh prefills (q = (37, 100)) on gloo ranks, value for value: every rank's
    rows (query starts, lengths) and, for P = 2 alone, its segment of the gathered slot
    mapping; under P = 2, D = 2 (example 2) the slots of the rank's own DCP shard (rank 0's
    first rows ``[640, -1, 641, -1]``: even positions are its own); every rank's restored
    rows equal the single-GPU step's."""
    target = functools.partial(pcp_workers.fresh_prefill_example, world=world, dcp=dcp)
    records = dcp_workers.spawn_ranks(target, tmp_path, world)
    _check(records, world, dcp, max_num_seqs=2)
    for p, (qsl, seq_lens, slots) in EXAMPLE_1.items():
        (got,) = records[p]["steps"]
        assert got["equal"]
        assert got["query_start_loc"] == qsl and got["seq_lens"] == seq_lens, p
        if dcp > 1:
            if p == 0:
                assert got["slot_mapping"][:4] == [640, -1, 641, -1]
        else:
            assert got["slot_mapping"] == slots + [-1] * (got["N"] - len(slots)), p


@pytest.mark.multigpu
@pytest.mark.parametrize(("dcp", "preset", "speculative"),
                         [(1, "deepseek-v3.2", 0), (2, "deepseek-v3.2", 0),
                          (2, "deepseek-v3.2", 1), (1, "deepseek-v4.1-flash", 0)])
def test_nccl_ranks_replay_the_oracle_rows_and_the_single_gpu_step(tmp_path, dcp, preset,
                                                                   speculative):
    """V4.1: the compressor's all-gather and ring saves in each rank's graph too (seed 9's
    steps continue requests from open groups on both ranks). V3.2 under DCP also with
    single-module MTP's decode rows."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs (NCCL takes one GPU per rank); the gloo run covers CPU")
    v41 = preset != "deepseek-v3.2"
    target = functools.partial(pcp_workers.demo_steps, world=2, device="cuda", dcp=dcp,
                               preset=preset, speculative=speculative,
                               **(dict(steps=10, seed=9) if v41 else {}))
    _check(dcp_workers.spawn_ranks(target, tmp_path, 2), 2, dcp, v41=v41)


def test_ranks_handed_different_splits_fail_on_every_rank_before_the_step(tmp_path):
    """One request's prefilling flag differs on rank 1 (same lengths): the split would
    differ, so the fenced step raises the same typed error on every rank, nothing run."""
    records = dcp_workers.spawn_ranks(pcp_workers.mismatched_prefill_flags, tmp_path, 2)
    for rank, record in enumerate(records):
        assert record["error"] == "RankMismatchError", record
        assert "seq_lens_checksum differs" in record["message"]
        assert "the PCP ranks were not handed the same step" in record["message"]
        assert record["message"].startswith(f"pcp_rank={rank}: "), record
        assert record["ran"] is False
