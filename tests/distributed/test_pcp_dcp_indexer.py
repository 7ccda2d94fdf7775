"""The real indexer's prefill rows under PCP + DCP (DeepSeek V3.2, ``D = P``;
``prefill-context-parallel.md`` §3.5): each rank's metadata built on the device from the
staged global batch, its shard of every request's keys in a cache of its own (placed by the
spec's ownership rule, written by the test independently of the package), its rows shared,
all-gathered, deinterleaved and scored -- every prefill token of every rank gets the top-k
of the single-GPU oracle, for interleave 1 and one that splits a request into runs; decode
tokens' rows say "no key". Every rank in one process (the all-gather played by copying
rows; DeepGEMM's ``fp8_mqa_logits`` emulated on CPU, the real one on CUDA), and gloo ranks
running the indexer whole."""

from __future__ import annotations

import functools

import pytest
import torch
from helpers import dcp_workers
from helpers import pcp_dcp_indexer as world_of
from helpers.dsa_reference import emulated_mqa_logits

from staticattn.consumers.real.caches import alloc_indexer_cache
from staticattn.distributed.pcp_dcp_indexer import PCPDCPPrefillTopK
from staticattn.distributed.pcp_rank import PCPRank
from staticattn.distributed.pcp_world import PCPSizes, configs
from staticattn.errors import ConfigError
from staticattn.kernels.runtime.dsa_libs import DEEP_GEMM, import_error

CUDA = [pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
        pytest.mark.skipif(bool(import_error(DEEP_GEMM)), reason=str(import_error(DEEP_GEMM)))]
#: (world, interleave, device, speculative tokens): single-module MTP's decode rows of 1 or
#: 2 tokens put more decode tokens than decode rows before the prefill tokens.
CASES = [(2, 1, "cpu", 0), (2, 16, "cpu", 0), (4, 1, "cpu", 0), (2, 1, "cpu", 1),
         pytest.param(2, 16, "cuda", 0, marks=CUDA), pytest.param(4, 1, "cuda", 0, marks=CUDA),
         pytest.param(2, 1, "cuda", 1, marks=CUDA)]


@pytest.mark.parametrize("world,interleave,device,speculative", CASES)
def test_every_rank_prefill_token_gets_the_single_gpu_topk(world, interleave, device,
                                                           speculative):
    """One process plays every rank (on CUDA: one GPU, DeepGEMM's kernel)."""
    ranks = [world_of.rank_pieces(world, interleave, device, p, speculative=speculative)
             for p in range(world)]
    steps, single = world_of.draw_steps(world, interleave,
                                        seed=world * 100 + interleave + 7 * speculative,
                                        speculative=speculative)
    drafts = sum(n > 1 and not pre for step in steps
                 for n, pre in zip(step["s"]["query_lens"], step["s"]["is_prefilling"]))
    assert drafts > 0 or not speculative, "no decode row of more than one token"
    scored = 0
    for step in steps:
        staged = [world_of.stage_rank(r, p, step, single, world, interleave)
                  for p, r in enumerate(ranks)]
        for r, (batch, _) in zip(ranks, staged):
            r.indexer.share(batch)
        for r in ranks:  # the all-gather, rank-major
            for d, other in enumerate(ranks):
                r.indexer.values[d].copy_(other.indexer.values[d])
                r.indexer.scales[d].copy_(other.indexer.scales[d])
        for p, (r, (batch, glob)) in enumerate(zip(ranks, staged)):
            problems, n = world_of.rank_problems(r.indexer.score(batch), glob, step)
            assert problems == [], (p, step["s"], problems)
            scored += n
    assert scored > 0, "no prefill token had more keys than the top-k"


def _check_ranks(records: list[dict]) -> None:
    for p, record in enumerate(records):
        assert record["problems"] == [], (p, record["problems"])
    assert sum(r["scored"] for r in records) > 0


def test_gloo_ranks_run_the_indexer_in_their_step(tmp_path):
    """Each rank a process, the indexer its ``PCPRank``'s layer: the rank's rows built from
    the staged global batch, then share, the all-gather over gloo, score."""
    target = functools.partial(world_of.rank_steps, world=2, interleave=4, seed=11)
    _check_ranks(dcp_workers.spawn_ranks(target, tmp_path, 2))


@pytest.mark.multigpu
@pytest.mark.parametrize("speculative", [0, 1])
def test_nccl_ranks_replay_the_indexer_in_their_graph(tmp_path, speculative):
    """One GPU a rank: the rank's graph holds the split, the builds and the indexer
    (DeepGEMM's ``fp8_mqa_logits``, the all-gather over NCCL)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs (NCCL takes one GPU per rank); the gloo run covers CPU")
    if import_error(DEEP_GEMM):
        pytest.skip(str(import_error(DEEP_GEMM)))
    target = functools.partial(world_of.rank_steps, world=2, interleave=4,
                               seed=208 if speculative else 11, device="cuda",
                               speculative=speculative)
    records = dcp_workers.spawn_ranks(target, tmp_path, 2)
    _check_ranks(records)
    assert all(r["graph"] for r in records)


def test_a_rank_without_dcp_is_refused():
    pcp, rank_cfg, _ = configs("deepseek-v3.2", 2, "cpu", PCPSizes(max_model_len=512))
    rank = PCPRank(pcp, rank_cfg, 64, 96, None, 0, 64)
    with pytest.raises(ConfigError, match="DCP group"):
        PCPDCPPrefillTopK(rank_cfg, rank.views, kv_cache=alloc_indexer_cache(64, 32, "cpu"),
                          q=torch.zeros(64, 32, 32), weights=torch.zeros(64, 32), topk=64,
                          logits_fn=emulated_mqa_logits)
