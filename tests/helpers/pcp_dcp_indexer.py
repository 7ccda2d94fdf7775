"""The setting of the PCP + DCP prefill-indexer tests (``distributed/test_pcp_dcp_layers.py``,
played by :mod:`helpers.pcp_dcp_ranks`): each rank's pieces (its rank, its sharded cache, its
indexer), the single GPU's keys, drawn steps with their oracle, and the check of a rank's
rows."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from helpers.dsa_reference import (
    check_topk,
    decode_token_table,
    dequant_indexer_cache,
    emulated_mqa_logits,
    ref_indexer_logits,
)
from helpers.pcp_dcp_ranks import owned_entries, rank_tokens
from staticattn.builders.pcp.rank_views import table_columns
from staticattn.consumers.real.caches import (
    INDEXER_BLOCK,
    alloc_indexer_cache,
    write_indexer_cache,
)
from staticattn.distributed.pcp_dcp_indexer import PCPDCPPrefillTopK
from staticattn.distributed.pcp_rank import PCPRank
from staticattn.distributed.pcp_world import PCPSizes, configs, random_pcp_step
from staticattn.kernels.runtime.dsa_libs import DEEP_GEMM

#: The libraries of the layer's real kernels (their torch emulations on CPU).
LIBRARIES = (DEEP_GEMM,)
TOPK = 64
HEADS, HEAD_DIM = 32, 32
STEPS = 5


def sizes(interleave: int, speculative: int = 0) -> PCPSizes:
    """The capacities (``speculative``: single-module MTP's decode rows of up to
    ``1 + speculative`` tokens)."""
    return PCPSizes(max_num_seqs=4, max_num_tokens=96, max_model_len=512,
                    interleave=interleave, num_speculative_tokens=speculative)


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


def shard(single: torch.Tensor, table: np.ndarray, lengths, world: int, interleave: int,
          rank: int) -> torch.Tensor:
    """Rank ``rank``'s cache: every key it owns (:func:`~helpers.pcp_dcp_ranks.
    owned_entries`) copied from the single GPU's; zeros elsewhere."""
    out = torch.zeros_like(single)
    for entry in owned_entries(table, lengths, world, interleave, rank):
        _copy_entry(single, entry[0], entry[1], out, entry[2], entry[3])
    return out


@dataclasses.dataclass
class RankPieces:
    """A :class:`helpers.pcp_dcp_ranks.Pieces`: the indexer's phases."""

    rank: PCPRank
    indexer: PCPDCPPrefillTopK
    cache: torch.Tensor

    @property
    def gathered(self) -> tuple[torch.Tensor, ...]:
        return self.indexer.values, self.indexer.scales

    def share(self, batch) -> None:
        self.indexer.share(batch)

    def finish(self, batch) -> torch.Tensor:
        return self.indexer.score(batch)


def rank_pieces(world: int, interleave: int, device: str, p: int, group=None,
                speculative: int = 0, graphs: bool = False) -> RankPieces:
    """Rank ``p``'s PCP rank (its views and builders; on CUDA with ``graphs`` a graph mode:
    its step captured), sharded cache and indexer, the rank's layer (DeepGEMM's kernel on
    CUDA, its emulation on CPU)."""
    sz = sizes(interleave, speculative)
    pcp, rank_cfg, _ = configs("deepseek-v3.2", world, device, sz, dcp=world, rank=p,
                               eager=not graphs)
    rank_cfg = dataclasses.replace(rank_cfg, index_topk=TOPK)
    N = sz.num_tokens(world, world)
    cache = alloc_indexer_cache(num_blocks(interleave), HEAD_DIM, device)
    q = torch.zeros(N, HEADS, HEAD_DIM, dtype=torch.float8_e4m3fn, device=device)

    def indexer(rank: PCPRank) -> PCPDCPPrefillTopK:  # the rank's layer: in its graph
        return PCPDCPPrefillTopK(
            rank.config, rank.views, kv_cache=cache, q=q,
            weights=torch.zeros(N, HEADS, device=device), topk=TOPK, group=group,
            logits_fn=emulated_mqa_logits if device == "cpu" else None)

    rank = PCPRank(pcp, rank_cfg, N, sz.max_num_tokens, group, p, num_blocks(interleave),
                   layer=indexer)
    return RankPieces(rank, rank.step, cache)


def table_width(interleave: int) -> int:
    _, _, single_cfg = configs("deepseek-v3.2", 2, "cpu", sizes(interleave))
    return max(table_columns(single_cfg).values())


def num_blocks(interleave: int) -> int:
    return sizes(interleave).kv_blocks(table_width(interleave))


def single_keys(interleave: int, seed: int) -> torch.Tensor:
    """The single GPU's cache (CPU), random keys."""
    single = alloc_indexer_cache(num_blocks(interleave), HEAD_DIM, "cpu")
    gen = torch.Generator().manual_seed(seed)
    write_indexer_cache(single, torch.randn(single.shape[0], INDEXER_BLOCK, HEAD_DIM,
                                            generator=gen))
    return single


def draw_steps(world: int, interleave: int, seed: int, speculative: int = 0):
    """``STEPS`` steps: each a dict of the global step ``s``, the queries and weights of its
    tokens (CPU), the oracle's logits ``ref``, each token's key count and prefilling flag;
    and the single GPU's cache."""
    single = single_keys(interleave, seed)
    keys = dequant_indexer_cache(single)
    sz, width = sizes(interleave, speculative), table_width(interleave)
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed + 1)
    steps = []
    for _ in range(STEPS):
        s = random_pcp_step(rng, sz, width)
        q_lens = np.asarray(s["query_lens"])
        seq = np.asarray(s["num_computed"]) + q_lens
        tok_req, _, tok_len = decode_token_table(q_lens, seq, 1)
        t = tok_req.shape[0]
        q = torch.randn(t, HEADS, HEAD_DIM, generator=gen).to(torch.float8_e4m3fn)
        weights = torch.randn(t, HEADS, generator=gen)
        index_table = s["table"][:, : sz.max_model_len // INDEXER_BLOCK]
        ref = ref_indexer_logits(q, weights, keys, index_table, tok_req, tok_len,
                                 sz.max_model_len)
        steps.append(dict(s=s, seq=seq, q=q, weights=weights, ref=ref, tok_len=tok_len,
                          prefilling=np.asarray(s["is_prefilling"])[tok_req]))
    return steps, single


def write_rank(pieces: RankPieces, p: int, step: dict, single: torch.Tensor, world: int,
               interleave: int) -> torch.Tensor:
    """The engine's work before rank ``p``'s step but the block rows
    (:func:`~helpers.pcp_views.write_block_rows`): its cache shard, and its tokens' queries
    and weights (the split is the oracle's, :mod:`staticattn.reference.pcp_layout`: the
    rank's own comes only with its step); returns its tokens' global indices (int64
    ``(n,)``, CPU)."""
    s, indexer = step["s"], pieces.indexer
    pieces.cache.copy_(shard(single, s["table"].numpy(), step["seq"], world, interleave, p))
    glob = rank_tokens(pieces.rank, p, s)
    n = glob.numel()
    indexer.q[:n].copy_(step["q"][glob].to(indexer.q.device))
    indexer.weights[:n].copy_(step["weights"][glob].to(indexer.weights.device))
    return glob


def rank_problems(pieces, out: torch.Tensor, glob: torch.Tensor, step: dict
                  ) -> tuple[list[str], int]:
    """A rank's rows (int32 ``(>= n, K)``) against the oracle: prefill tokens' top-k, decode
    tokens' rows -1; and how many of its prefill tokens had more keys than the top-k."""
    g = glob.numpy()
    out = out[: g.size].cpu()
    pre = step["prefilling"][g]
    problems = [] if (out[~torch.from_numpy(pre)] == -1).all() else ["a decode row scored"]
    problems += check_topk(out[torch.from_numpy(pre)], step["ref"][g[pre]],
                           step["tok_len"][g[pre]])
    return problems, int((step["tok_len"][g[pre]] > out.shape[1]).sum())
