"""The setting of the PCP + DCP sparse-attention tests (``distributed/test_pcp_dcp_layers.py``,
played by :mod:`helpers.pcp_dcp_ranks`): DeepSeek V3.2's prefill attention whole on each rank
(:class:`~staticattn.distributed.pcp_dcp_attention.PCPDCPSparseAttention`: the indexer's
top-k feeding the sparse-MLA prefill), both caches sharded by the spec's ownership rule, and
the check of a rank's rows: its indexer's top-k against the oracle's logits (key sets may
differ only where logits tie), and its attention against the single-GPU oracle's over that
top-k -- so the rank's output is the single-GPU step's."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from helpers import pcp_dcp_indexer as indexer_setting
from helpers import pcp_dcp_sparse_mla as mla_setting
from helpers.dsa_reference import attention_problems, emulated_mqa_logits
from helpers.pcp_dcp_indexer import HEAD_DIM, num_blocks, sizes
from helpers.pcp_dcp_ranks import rank_tokens
from helpers.sparse_mla_reference import emulated_sparse_fwd, kernel_abs_tol, oracle_attention
from helpers.sparse_mla_steps import tiled_cache
from staticattn.consumers.real.caches import alloc_indexer_cache
from staticattn.consumers.real.sparse_mla_prefill import V32_SOFTMAX_SCALE
from staticattn.distributed.pcp_dcp_attention import PCPDCPSparseAttention
from staticattn.distributed.pcp_rank import PCPRank
from staticattn.distributed.pcp_world import configs
from staticattn.kernels.runtime.dsa_libs import DEEP_GEMM, FLASH_MLA

#: Both libraries' real kernels run on CUDA (their torch emulations on CPU).
LIBRARIES = (DEEP_GEMM, FLASH_MLA)
TOPK = 128
INDEX_HEADS, HEADS = indexer_setting.HEADS, mla_setting.HEADS


@dataclasses.dataclass
class RankPieces:
    """A :class:`helpers.pcp_dcp_ranks.Pieces`: the layer's phases."""

    rank: PCPRank
    layer: PCPDCPSparseAttention
    index_cache: torch.Tensor
    kv_cache: torch.Tensor

    @property
    def gathered(self) -> tuple[torch.Tensor, ...]:
        i, a = self.layer.indexer, self.layer.attention
        return i.values, i.scales, a.workspace

    def share(self, batch) -> None:
        self.layer.share(batch)

    def finish(self, batch) -> torch.Tensor:
        return self.layer.finish(batch)


def rank_pieces(world: int, interleave: int, device: str, p: int, group=None,
                speculative: int = 0, graphs: bool = False) -> RankPieces:
    """Rank ``p``'s PCP rank whose layer is the whole attention (DeepGEMM's and FlashMLA's
    kernels on CUDA, their emulations on CPU; with ``graphs`` on CUDA the rank's step
    captured) and its two sharded caches."""
    sz = sizes(interleave, speculative)
    pcp, rank_cfg, _ = configs("deepseek-v3.2", world, device, sz, dcp=world, rank=p,
                               eager=not graphs)
    rank_cfg = dataclasses.replace(rank_cfg, index_topk=TOPK)
    N, blocks = sz.num_tokens(world, world), num_blocks(interleave)
    index_cache = alloc_indexer_cache(blocks, HEAD_DIM, device)
    kv_cache = tiled_cache(blocks, device)
    emulated = device == "cpu"

    def layer(rank: PCPRank) -> PCPDCPSparseAttention:  # the rank's layer: in its graph
        return PCPDCPSparseAttention(
            rank.config, rank.views, index_cache=index_cache,
            index_q=torch.zeros(N, INDEX_HEADS, HEAD_DIM, dtype=torch.float8_e4m3fn,
                                device=device),
            weights=torch.zeros(N, INDEX_HEADS, device=device), kv_cache=kv_cache,
            q=torch.zeros(N, HEADS, 576, dtype=torch.bfloat16, device=device), topk=TOPK,
            group=group, logits_fn=emulated_mqa_logits if emulated else None,
            sparse_fwd_fn=emulated_sparse_fwd if emulated else None)

    rank = PCPRank(pcp, rank_cfg, N, sz.max_num_tokens, group, p, blocks, layer=layer)
    return RankPieces(rank, rank.step, index_cache, kv_cache)


def draw_steps(world: int, interleave: int, seed: int, speculative: int = 0):
    """The indexer setting's steps (queries, weights, the oracle's logits), each with the
    attention's queries (bf16 ``(T, H, 576)``) and the single GPU's ``fp8_ds_mla`` cache;
    the two single-GPU caches."""
    steps, index_keys = indexer_setting.draw_steps(world, interleave, seed, speculative)
    gen = torch.Generator().manual_seed(seed + 2)
    kv = mla_setting.single_cache(interleave)
    for step in steps:
        t = step["q"].shape[0]
        step["q_att"] = torch.randn(t, HEADS, 576, generator=gen).to(torch.bfloat16)
        step["cache"] = kv
    return steps, (index_keys, kv)


def write_rank(pieces: RankPieces, p: int, step: dict, single, world: int,
               interleave: int) -> torch.Tensor:
    """Both caches' shards and the rank's tokens' queries and weights; returns its tokens'
    global indices."""
    index_keys, kv = single
    s, layer = step["s"], pieces.layer
    table = s["table"].numpy()
    pieces.index_cache.copy_(indexer_setting.shard(index_keys, table, step["seq"], world,
                                                   interleave, p))
    pieces.kv_cache.copy_(mla_setting.shard(kv, table, step["seq"], world, interleave, p))
    glob = rank_tokens(pieces.rank, p, s)
    n, dev = glob.numel(), pieces.kv_cache.device
    layer.indexer.q[:n].copy_(step["q"][glob].to(dev))
    layer.indexer.weights[:n].copy_(step["weights"][glob].to(dev))
    layer.attention.q[:n].copy_(step["q_att"][glob].to(dev))
    return glob


def rank_problems(pieces: RankPieces, out: torch.Tensor, glob: torch.Tensor, step: dict
                  ) -> tuple[list[str], int]:
    """The rank's top-k (the indexer setting's check), then its prefill tokens' attention
    against the oracle's over that top-k, every other row zero; the prefill tokens
    checked."""
    problems, _ = indexer_setting.rank_problems(pieces, pieces.layer.indexer.out, glob, step)
    g = glob.numpy()
    pre = step["prefilling"][g]
    s = step["s"]
    q_lens = np.asarray(s["query_lens"])
    topk = np.full((step["q"].shape[0], TOPK), -1, dtype=np.int32)
    topk[g[pre]] = pieces.layer.indexer.out[: g.size].cpu().numpy()[pre]
    table = s["table"].numpy()
    ref = oracle_attention(step["q_att"], step["cache"], table, q_lens, step["seq"], topk,
                           V32_SOFTMAX_SCALE)
    tol = kernel_abs_tol(out.device, step["cache"], table, q_lens, step["seq"], topk)
    got = out.cpu()
    problems += attention_problems(got[: g.size][torch.from_numpy(pre)], ref[g[pre]],
                                   abs_tol=tol[g[pre]])
    rest = torch.ones(got.shape[0], dtype=torch.bool)
    rest[torch.from_numpy(np.nonzero(pre)[0])] = False
    if got[rest].any():
        problems.append("a row other than a prefill token's is not zero")
    return problems, int(pre.sum())
