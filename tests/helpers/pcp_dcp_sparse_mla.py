"""The setting of the PCP + DCP sparse-MLA prefill tests (``distributed/
test_pcp_dcp_layers.py``, played by :mod:`helpers.pcp_dcp_ranks`): each rank's pieces
(its rank, whose layer is the consumer over the step's top-k rows, its shard of the
``fp8_ds_mla`` cache), drawn global steps with their queries, top-k rows and oracle, and the
check of a rank's rows."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from helpers.dsa_reference import decode_token_table
from helpers.pcp_dcp_indexer import num_blocks, sizes, table_width
from helpers.pcp_dcp_ranks import owned_entries, rank_tokens
from helpers.sparse_mla_reference import (
    UNTOUCHED,
    draw_topk,
    emulated_sparse_fwd,
    kernel_abs_tol,
    oracle_attention,
    served_row_problems,
)
from helpers.sparse_mla_steps import tiled_cache
from staticattn.consumers.real.sparse_mla_prefill import V32_SOFTMAX_SCALE
from staticattn.distributed.pcp_dcp_sparse_mla import PCPDCPSparseMLAPrefill
from staticattn.distributed.pcp_rank import PCPRank
from staticattn.distributed.pcp_world import configs, random_pcp_step
from staticattn.kernels.runtime.dsa_libs import FLASH_MLA

#: The libraries of the layer's real kernels (their torch emulations on CPU).
LIBRARIES = (FLASH_MLA,)
TOPK, HEADS = 128, 64
STEPS = 4


def shard(single: torch.Tensor, table: np.ndarray, lengths, world: int, interleave: int,
          rank: int) -> torch.Tensor:
    """Rank ``rank``'s ``fp8_ds_mla`` cache: every key it owns (:func:`~helpers.
    pcp_dcp_ranks.owned_entries`) copied from the single GPU's; zeros elsewhere."""
    out = torch.zeros_like(single)
    for src_block, src_off, block, off in owned_entries(table, lengths, world, interleave,
                                                        rank):
        out[block, off] = single[src_block, src_off]
    return out


@dataclasses.dataclass
class RankPieces:
    """A :class:`helpers.pcp_dcp_ranks.Pieces`: the consumer's phases over ``topk`` (int32
    ``(N, K)``, the step's top-k rows by local token) into ``out`` (bf16 ``(N, H, 512)``)."""

    rank: PCPRank
    consumer: PCPDCPSparseMLAPrefill
    cache: torch.Tensor
    topk: torch.Tensor
    out: torch.Tensor

    @property
    def gathered(self) -> tuple[torch.Tensor, ...]:
        return (self.consumer.workspace,)

    def share(self, batch) -> None:
        self.consumer.share(batch)

    def finish(self, batch) -> torch.Tensor:
        self.consumer.attend(batch, self.topk, self.out)
        return self.out


@dataclasses.dataclass
class _Layer:
    """The consumer as a rank's step (``step(batch, md) -> step.out``) over fixed top-k
    rows."""

    consumer: PCPDCPSparseMLAPrefill
    topk: torch.Tensor
    out: torch.Tensor

    def __call__(self, batch, md) -> torch.Tensor:
        self.consumer(batch, self.topk, self.out)
        return self.out


def rank_pieces(world: int, interleave: int, device: str, p: int, group=None,
                speculative: int = 0, graphs: bool = False) -> RankPieces:
    """Rank ``p``'s PCP rank whose layer is the consumer over the top-k rows in
    ``RankPieces.topk`` (FlashMLA's kernel on CUDA, its emulation on CPU; with ``graphs``
    on CUDA the rank's step captured), its sharded cache and its rows."""
    sz = sizes(interleave, speculative)
    pcp, rank_cfg, _ = configs("deepseek-v3.2", world, device, sz, dcp=world, rank=p,
                               eager=not graphs)
    rank_cfg = dataclasses.replace(rank_cfg, index_topk=TOPK)
    N = sz.num_tokens(world, world)
    cache = tiled_cache(num_blocks(interleave), device)
    q = torch.zeros(N, HEADS, 576, dtype=torch.bfloat16, device=device)
    topk = torch.full((N, TOPK), -1, dtype=torch.int32, device=device)
    out = torch.full((N, HEADS, 512), UNTOUCHED, dtype=torch.bfloat16, device=device)

    def layer(rank: PCPRank) -> _Layer:  # the rank's layer: in its graph
        return _Layer(PCPDCPSparseMLAPrefill(
            rank.config, rank.views, kv_cache=cache, q=q, topk=TOPK, group=group,
            sparse_fwd_fn=emulated_sparse_fwd if device == "cpu" else None), topk, out)

    rank = PCPRank(pcp, rank_cfg, N, sz.max_num_tokens, group, p, num_blocks(interleave),
                   layer=layer)
    return RankPieces(rank, rank.step.consumer, cache, topk, out)


def single_cache(interleave: int) -> torch.Tensor:
    """The single GPU's ``fp8_ds_mla`` cache (CPU): keys whose tiles have unlike scales."""
    return tiled_cache(num_blocks(interleave), "cpu")


def draw_steps(world: int, interleave: int, seed: int, speculative: int = 0):
    """``STEPS`` steps with a prefill (drawn steps of decodes alone are passed over): each a
    dict of the global step ``s``, its tokens' queries (bf16 ``(T, H, 576)``) and top-k rows
    (int32 ``(T, K)``), the oracle's attention ``ref`` (fp32 ``(T, H, 512)``), its
    tolerance and each token's prefilling flag."""
    single = single_cache(interleave)
    sz, width = sizes(interleave, speculative), table_width(interleave)
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed + 1)
    steps = []
    while len(steps) < STEPS:
        s = random_pcp_step(rng, sz, width)
        if not any(s["is_prefilling"]):
            continue
        q_lens = np.asarray(s["query_lens"])
        seq = np.asarray(s["num_computed"]) + q_lens
        tok_req = decode_token_table(q_lens, seq, 1)[0]
        t = tok_req.shape[0]
        q = torch.randn(t, HEADS, 576, generator=gen).to(torch.bfloat16)
        topk = draw_topk(rng, q_lens, seq, TOPK, t)
        table = s["table"].numpy()
        ref = oracle_attention(q, single, table, q_lens, seq, topk, V32_SOFTMAX_SCALE)
        steps.append(dict(s=s, seq=seq, q=q, topk=torch.from_numpy(topk), ref=ref,
                          tol=(single, table, q_lens, seq, topk),
                          prefilling=np.asarray(s["is_prefilling"])[tok_req]))
    return steps, single


def write_rank(pieces: RankPieces, p: int, step: dict, single: torch.Tensor, world: int,
               interleave: int) -> torch.Tensor:
    """The engine's work before rank ``p``'s step but the block rows: its cache shard, its
    tokens' queries and top-k rows (the split is the oracle's,
    :mod:`staticattn.reference.pcp_layout`), its output rows reset; returns its tokens'
    global indices (int64 ``(n,)``, CPU)."""
    s = step["s"]
    pieces.cache.copy_(shard(single, s["table"].numpy(), step["seq"], world, interleave, p))
    glob = rank_tokens(pieces.rank, p, s)
    n = glob.numel()
    dev = pieces.cache.device
    pieces.consumer.q[:n].copy_(step["q"][glob].to(dev))
    pieces.topk.fill_(-1)
    pieces.topk[:n].copy_(step["topk"][glob].to(dev))
    pieces.out.fill_(UNTOUCHED)
    return glob


def rank_problems(pieces, out: torch.Tensor, glob: torch.Tensor, step: dict
                  ) -> tuple[list[str], int]:
    """A rank's output rows (bf16 ``(>= n, H, 512)``) against the oracle: its prefill
    tokens' attention, its decode tokens' rows untouched; and how many prefill tokens it
    checked."""
    g = glob.numpy()
    got = out[: g.size].cpu()
    pre = torch.from_numpy(step["prefilling"][g])
    tol = kernel_abs_tol(out.device, *step["tol"])[g[pre.numpy()]]
    return served_row_problems(got, step["ref"][g[pre.numpy()]], pre, tol), int(pre.sum())
