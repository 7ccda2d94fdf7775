"""The real indexer's prefill rows under PCP + DCP (DeepSeek V3.2, ``D = P``;
``prefill-context-parallel.md`` §3.5), every rank in one process on the CPU (DeepGEMM's
``fp8_mqa_logits`` emulated in torch): each rank's metadata built on the device from the
staged global batch, its shard of every request's keys in a cache of its own (placed by the
spec's ownership rule, written here independently of the package), its rows shared, the
all-gather played by copying every rank's rows to every other, the deinterleave and the
scoring -- every prefill token of every rank gets the top-k of the single-GPU oracle, for
interleave 1 and one that splits a request into runs; decode tokens' rows say "no key"."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from helpers.dsa_reference import (
    check_topk,
    decode_token_table,
    dequant_indexer_cache,
    emulated_mqa_logits,
    ref_indexer_logits,
)

from staticattn.builders.pcp.rank_views import table_columns
from staticattn.consumers.real.caches import INDEXER_BLOCK, alloc_indexer_cache, write_indexer_cache
from staticattn.distributed.pcp_dcp_indexer import PCPDCPPrefillTopK
from staticattn.distributed.pcp_rank import PCPRank
from staticattn.distributed.pcp_world import PCPSizes, configs, random_pcp_step
from staticattn.errors import ConfigError
from staticattn.kernels.runtime.dsa_libs import DEEP_GEMM, import_error

TOPK = 64
HEADS, HEAD_DIM = 32, 32


def _copy_entry(src: torch.Tensor, src_block: int, src_off: int, dst: torch.Tensor,
                dst_block: int, dst_off: int) -> None:
    """One entry's values (``D`` bytes at ``off * D``) and scale (4 bytes after the block's
    ``64 * D`` value bytes) from one indexer cache to another."""
    d = src.shape[-1] - 4
    s, t = src.view(src.shape[0], -1), dst.view(dst.shape[0], -1)
    t[dst_block, dst_off * d:(dst_off + 1) * d] = s[src_block, src_off * d:(src_off + 1) * d]
    base = INDEXER_BLOCK * d
    t[dst_block, base + 4 * dst_off:base + 4 * dst_off + 4] = (
        s[src_block, base + 4 * src_off:base + 4 * src_off + 4])


def _shard(single: torch.Tensor, table: np.ndarray, lengths, world: int, interleave: int,
           caches: list[torch.Tensor]) -> None:
    """Every key ``e`` of request ``b`` (``e < lengths[b]``) into its owner's cache: rank
    ``(e // I) % D`` holds it at local index ``(e // (D I)) I + e % I``, through the
    request's block row (the single GPU keeps it at ``e``)."""
    for b, length in enumerate(lengths):
        for e in range(int(length)):
            owner = (e // interleave) % world
            local = (e // (world * interleave)) * interleave + e % interleave
            _copy_entry(single, int(table[b, e // INDEXER_BLOCK]), e % INDEXER_BLOCK,
                        caches[owner], int(table[b, local // INDEXER_BLOCK]),
                        local % INDEXER_BLOCK)


CUDA = [pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
        pytest.mark.skipif(bool(import_error(DEEP_GEMM)), reason=str(import_error(DEEP_GEMM)))]
CASES = [(2, 1, "cpu"), (2, 16, "cpu"), (4, 1, "cpu"),
         pytest.param(2, 16, "cuda", marks=CUDA), pytest.param(4, 1, "cuda", marks=CUDA)]


@pytest.mark.parametrize("world,interleave,device", CASES)
def test_every_rank_prefill_token_gets_the_single_gpu_topk(world, interleave, device):
    """On CUDA with DeepGEMM's kernel, one GPU playing every rank."""
    sizes = PCPSizes(max_num_seqs=4, max_num_tokens=96, max_model_len=512,
                     interleave=interleave)
    cfgs = [configs("deepseek-v3.2", world, device, sizes, dcp=world, rank=p, eager=True)
            for p in range(world)]
    emulated = device == "cpu"
    single_cfg = cfgs[0][2]
    width = max(table_columns(single_cfg).values())
    blocks = sizes.kv_blocks(width)
    N = sizes.num_tokens(world, world)
    ranks, indexers, caches = [], [], []
    for p, (pcp, rank_cfg, _) in enumerate(cfgs):
        rank_cfg = dataclasses.replace(rank_cfg, index_topk=TOPK)
        ranks.append(PCPRank(pcp, rank_cfg, N, sizes.max_num_tokens, None, p, blocks))
        caches.append(alloc_indexer_cache(blocks, HEAD_DIM, device))
        q = torch.zeros(N, HEADS, HEAD_DIM, dtype=torch.float8_e4m3fn, device=device)
        indexers.append(PCPDCPPrefillTopK(
            rank_cfg, ranks[-1].views, kv_cache=caches[-1], q=q,
            weights=torch.zeros(N, HEADS, device=device), topk=TOPK,
            logits_fn=emulated_mqa_logits if emulated else None))
    single = alloc_indexer_cache(blocks, HEAD_DIM, "cpu")
    gen = torch.Generator().manual_seed(world)
    write_indexer_cache(single, torch.randn(blocks, INDEXER_BLOCK, HEAD_DIM, generator=gen))
    keys = dequant_indexer_cache(single)
    rng = np.random.default_rng(world * 100 + interleave)
    scored = 0
    for _ in range(5):
        s = random_pcp_step(rng, sizes, width)
        q_lens = np.asarray(s["query_lens"])
        seq = np.asarray(s["num_computed"]) + q_lens
        table = s["table"].numpy()
        shards = [torch.zeros_like(single) for _ in caches]
        _shard(single, table, seq, world, interleave, shards)
        for cache, shard in zip(caches, shards):
            cache.copy_(shard)
        tok_req, _, tok_len = decode_token_table(q_lens, seq, 1)
        t = tok_req.shape[0]
        q = torch.randn(t, HEADS, HEAD_DIM, generator=gen).to(torch.float8_e4m3fn)
        weights = torch.randn(t, HEADS, generator=gen)
        index_table = s["table"][:, : sizes.max_model_len // INDEXER_BLOCK]
        ref = ref_indexer_logits(q, weights, keys, index_table,
                                 tok_req, tok_len, sizes.max_model_len)
        prefilling = np.asarray(s["is_prefilling"])[tok_req]
        batches, locals_ = [], []
        for p, (rank, indexer) in enumerate(zip(ranks, indexers)):
            for view in rank.views.tables.values():
                view[: q_lens.size].copy_(s["table"][:, : view.shape[1]])
            rank.check(q_lens, s["is_prefilling"], s["num_computed"])
            rank.stage(q_lens, s["is_prefilling"], s["num_computed"], s["req_state_idx"])
            batch, _ = rank.metadata()
            n = int(rank.views.rows.num_tokens[p])
            glob = rank.views.rows.token_to_global[p, :n].long()
            indexer.q[:n].copy_(q[glob.cpu()])
            indexer.weights[:n].copy_(weights[glob.cpu()])
            indexer.share(batch)
            batches.append(batch)
            locals_.append(glob.cpu().numpy())
        for indexer in indexers:  # the all-gather, rank-major
            for d, other in enumerate(indexers):
                indexer.values[d].copy_(other.values[d])
                indexer.scales[d].copy_(other.scales[d])
        for p, (indexer, batch, g) in enumerate(zip(indexers, batches, locals_)):
            out = indexer.score(batch)[: g.size].cpu()
            pre = prefilling[g]
            assert (out[~torch.from_numpy(pre)] == -1).all(), p
            problems = check_topk(out[torch.from_numpy(pre)], ref[g[pre]], tok_len[g[pre]])
            assert problems == [], (p, s, problems)
            scored += int((tok_len[g[pre]] > TOPK).sum())
    assert scored > 0, "no prefill token had more keys than the top-k"


def test_a_rank_without_dcp_is_refused():
    pcp, rank_cfg, _ = configs("deepseek-v3.2", 2, "cpu", PCPSizes(max_model_len=512))
    rank = PCPRank(pcp, rank_cfg, 64, 96, None, 0, 64)
    with pytest.raises(ConfigError, match="DCP group"):
        PCPDCPPrefillTopK(rank_cfg, rank.views, kv_cache=alloc_indexer_cache(64, 32, "cpu"),
                          q=torch.zeros(64, 32, 32), weights=torch.zeros(64, 32), topk=64,
                          logits_fn=emulated_mqa_logits)
