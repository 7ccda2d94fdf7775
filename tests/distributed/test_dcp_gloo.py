"""Decode context parallelism across processes on the CPU: two ranks joined by gloo.

* the exact top-k merge of prefill and decode rows (:class:`DCPTopKMerge`);
* consistent steps: each rank builds its own metadata for the same random steps (after the
  cross-rank step check); the ranks all-gather their outputs and each rank's equals the
  per-rank oracle, the local lengths add up to the global ones, and the SWA rows are the same
  on every rank (replicated);
* inconsistent steps (different batch sizes on the two ranks): the typed error on every
  rank, before anything is staged;
* a rank that never joins the check: the typed error on the other within its timeout.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
import pytest
import torch.distributed as dist
from helpers import dcp_workers as workers

from staticattn.reference import dcp_indexer as oracle
from staticattn.reference import topk_attention

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="needs torch.distributed with gloo")


def _host_step(cfg, s) -> SimpleNamespace:
    q, L = np.array(s["query_lens"]), np.array(s["seq_lens"])
    return SimpleNamespace(
        query_lens=q, seq_lens=L, block_table=np.array(s["block_table"]),
        num_reqs=len(q), num_tokens=int(q.sum()), num_reqs_padded=len(q),
        num_tokens_padded=int(q.sum()), slot_mapping=np.zeros(int(q.sum()), np.int64),
        query_start_loc=[0, *np.cumsum(q).tolist()],
        padded_seq_lens=lambda: [int(x) for x in L],
    )


@pytest.mark.parametrize(("world", "steps"), [(2, 200), (4, 80)])
def test_ranks_build_consistent_metadata(tmp_path, world, steps):
    """280 random steps over both worlds (200 on 2 ranks, 80 on 4), each rank's metadata of
    each (720 in all) against the per-rank oracle."""
    target = functools.partial(workers.consistent_steps, world=world, steps=steps)
    records = workers.spawn_ranks(target, tmp_path, world)
    assert all(r == records[0] for r in records)  # every rank gathered the same outputs
    checked = 0
    for s in records[0]["steps"]:
        every = s["ranks"]
        for rank, got in enumerate(every):
            cfg = workers.config(rank, world)
            want = oracle.indexer_metadata(cfg, _host_step(cfg, s), rank)
            assert got["slot_mapping"] == want["slot_mapping"]
            if want["decode"] is None:
                assert got["decode_seq_lens"] is None
            else:
                assert got["decode_seq_lens"] == want["decode"]["seq_lens"]
                assert got["decode_global"] == want["decode"]["global_seq_lens"]
            assert got["chunks"] == [
                [c["local_cu_seq_lens"], c["cu_seqlen_ks"], c["cu_seqlen_ke"],
                 c["local_total_seq_lens"], c["max_local_total_seq_lens"]]
                for c in want["prefill"] or []]
            checked += 1
        if every[0]["decode_seq_lens"] is not None:
            summed = np.sum([r["decode_seq_lens"] for r in every], axis=0).tolist()
            assert summed == every[0]["decode_global"]
        assert all(r["swa"] == every[0]["swa"] for r in every)
    assert checked == steps * world


def test_dcp_consumer_merges_to_the_single_gpu_step_and_the_oracle(tmp_path):
    """Each rank scores its keys, the candidates and partial outputs are all-gathered and
    merged: every rank ends with the single-GPU step's top-k (exactly) and output (float32
    rounding), and both equal the oracle over the global keys."""
    from staticattn.distributed.world import TOPK, random_decode_step

    records = workers.spawn_ranks(workers.consumer_steps, tmp_path)
    rng = np.random.default_rng(4321)
    cfg = workers.config(0)
    tokens = 0
    for rank0, rank1 in zip(records[0]["steps"], records[1]["steps"]):
        data = random_decode_step(cfg, rng)
        (dcp, single), (dcp1,) = rank0, rank1
        assert dcp == dcp1  # every rank holds the merged result
        assert dcp["ids"] == single["ids"]
        np.testing.assert_allclose(dcp["out"], single["out"], rtol=1e-5, atol=1e-6)
        n, ratio = cfg.next_n, cfg.index_compress_ratio
        for t in range(len(data["seq_lens"]) * n):
            b, c = divmod(t, n)
            visible = (int(data["seq_lens"][b]) - n + 1 + c) // ratio
            ids, out = topk_attention.decode_token(
                data["q"][t].numpy(), data["weights"][t].numpy(), data["q_att"][t].numpy(),
                data["keys"][b].numpy(), data["kv"][b].numpy(), visible, TOPK)
            assert dcp["ids"][t] == ids + [-1] * (TOPK - len(ids))
            np.testing.assert_allclose(dcp["out"][t], out, rtol=1e-4, atol=1e-5)
            tokens += 1
    assert len(records[0]["steps"]) == workers.CONSUMER_STEPS and tokens > 0


def test_prefill_and_decode_rows_merge_to_the_exact_topk(tmp_path):
    """§7.1's merge over gloo: the ranks' local top-k of a prefill chunk's rows (chunk-wide
    logits, row starts) and a decode row merge, on every rank, to the single-GPU top-k."""
    _check_merged(workers.spawn_ranks(workers.topk_merge_rows, tmp_path))


@pytest.mark.multigpu
def test_prefill_and_decode_rows_merge_over_nccl(tmp_path):
    """The same merge with one GPU per rank, the candidates all-gathered over NCCL."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs (NCCL takes one GPU per rank); the gloo run covers CPU")
    _check_merged(workers.spawn_ranks(functools.partial(workers.topk_merge_rows, device="cuda"),
                         tmp_path))


def _check_merged(records: list[dict]) -> None:
    from staticattn.reference import dcp_topk

    assert records[0] == records[1]
    rng = np.random.default_rng(99)
    for ids in records[0]["ids"]:
        rows = workers.merge_rows(rng)
        assert ids == [dcp_topk.exact_topk(r, workers.MERGE_TOPK) for r in rows]


def test_inconsistent_steps_fail_on_every_rank_before_staging(tmp_path):
    records = workers.spawn_ranks(workers.mismatched_steps, tmp_path)
    for record in records:
        assert record["error"] == "RankMismatchError"
        assert "num_reqs differs across ranks: [3, 4]" in record["message"]
        assert record["staged"] is False


@pytest.mark.parametrize(("target", "error", "says"), [
    (workers.mismatched_lengths, "RankMismatchError", "seq_lens_checksum differs"),
    (workers.duplicate_rank, "RankMismatchError", "group rank 1 holds dcp_rank=0"),
    (workers.wrong_world, "ConfigError", "the process group has 2 ranks"),
], ids=["lengths", "duplicate-rank", "wrong-world"])
def test_every_rank_refuses_a_step_the_group_does_not_agree_on(tmp_path, target, error, says):
    for record in workers.spawn_ranks(target, tmp_path):
        assert record["error"] == error and says in record["message"], record
        assert record["staged"] is False


def test_the_check_needs_torch_distributed():
    from staticattn.errors import ConfigError
    from staticattn.validation.dcp_step import check_dcp_step

    assert not dist.is_initialized()
    with pytest.raises(ConfigError, match="needs torch.distributed initialised"):
        check_dcp_step(workers.config(0), np.array([2]), np.array([9]))


def test_a_silent_rank_is_a_typed_error_not_a_hang(tmp_path):
    records = workers.spawn_ranks(workers.silent_rank, tmp_path)
    assert records[0]["error"] == "RankTimeoutError"
    assert 2 <= records[0]["waited_s"] < 8  # the 2 s timeout was honoured, not a hang
