"""The exact top-k merge under decode context parallelism, for decode and prefill rows
alike (``vllm-0.33-extras.md`` §7.1, the reference's ``_merge_dcp_topk_global``).

Each rank ranks the keys it holds of a row (local indices ``l``, request-local); the merge
needs them as candidates every rank can compare:

1. **pack** (per rank): ``(score, global id)`` per local candidate, ``score =
   logits[row, l + row_start]`` -- ``row_start`` the row's first logit column when the
   logits matrix spans the whole chunk (a prefill chunk's ``cu_seqlen_ks``), 0 when the
   logits are row-local (decode rows, DeepGEMM's row-local prefill logits) -- and
   ``id = (l // I) * (world * I) + rank * I + l % I``; ``l < 0`` packs ``(-inf, -1)``;
2. **all-gather** the packs (the caller's collective, rank-major);
3. **merge**: the ``K`` best by score, ties to the smaller id, empty candidates last, -1
   past the valid ones. Exact as long as each rank packed its ``min(K, its keys)`` best:
   a key of the global top ``K`` is among its owner's.

Example (prefill rows, world 2, ``I = 1``, ``K = 2``; spec §7.1): row 0's global scores
``[0.5, 3.0, 1.0, 2.5, 0.1, 4.0, 0.2]``: rank 0 packs ``[(1.0, 2), (0.5, 0)]``, rank 1
``[(4.0, 5), (3.0, 1)]``, merged ``[5, 1]``.

Plain torch (float pairs: float64, or float32 where every id is below ``2 ** 24``, exact
there as the reference packs them), graph-safe: outputs into given views, no
host read; temporaries come from a graph's pool when captured.
"""

from __future__ import annotations

import torch

from staticattn.kernels.dcp.ownership import dcp_global_index

__all__ = ["merge_candidates", "pack_candidates", "pack_scored"]


def pack_candidates(local_topk: torch.Tensor, logits: torch.Tensor,
                    row_starts: torch.Tensor | None, out: torch.Tensor, *, world: int,
                    rank: int, interleave: int) -> None:
    """Write this rank's candidates of ``n`` rows into ``out``, their scores read from the
    logits.

    Parameters
    ----------
    local_topk : int device ``(n, k')``
        Local key indices per row (request-local), -1 = none.
    logits : float device ``(n, cols)``
        The rank's scores: column ``l + row_start`` of row ``t`` scores local key ``l``.
    row_starts : int device ``(n,)`` or None
        Each row's first column (full-width logits); None: row-local logits (0).
    out : float32 or float64 device ``(n, k', 2)``
        ``[..., 0]`` the score, ``[..., 1]`` the global id (-inf, -1 for an empty one); in
        float32 the ids must stay below ``2 ** 24``.
    world, rank, interleave : int
        The DCP layout of the keys counted (``I // R`` for compressed keys).
    """
    local = local_topk.clamp(min=0).to(torch.int64)
    column = local if row_starts is None else local + row_starts.to(torch.int64)[:, None]
    column = column.clamp(max=logits.shape[1] - 1)
    pack_scored(local_topk, logits.gather(1, column), out, world=world, rank=rank,
                interleave=interleave)


def pack_scored(local_topk: torch.Tensor, scores: torch.Tensor, out: torch.Tensor, *,
                world: int, rank: int, interleave: int) -> None:
    """:func:`pack_candidates` of a local top-k that comes with its scores: ``local_topk``
    int ``(n, k')`` (-1 = none), ``scores`` float32 ``(n, k')``, ``scores[t, i]`` the score
    of ``local_topk[t, i]`` (any value where that is -1), as a top-k kernel returns them;
    ``out`` float32 or float64 ``(n, k', 2)``."""
    valid = local_topk >= 0
    local = local_topk.clamp(min=0).to(torch.int64)
    ids = dcp_global_index(local, world, rank, interleave)
    out[..., 0] = torch.where(valid, scores.to(out.dtype), float("-inf"))
    out[..., 1] = torch.where(valid, ids, -1).to(out.dtype)


def merge_candidates(candidates: torch.Tensor, out: torch.Tensor) -> None:
    """The global top-``K`` of every row from all ranks' candidates.

    Parameters
    ----------
    candidates : float32 or float64 device ``(world, n, k', 2)``
        Every rank's :func:`pack_candidates`, rank-major (an all-gather's layout).
    out : int64 device ``(n, K)``
        Global ids, best first (ties: the smaller id), -1 past the row's valid candidates.
    """
    n = candidates.shape[1]
    pairs = candidates.permute(1, 0, 2, 3).reshape(n, -1, 2)
    scores, ids = pairs[..., 0], pairs[..., 1].to(torch.int64)
    # By id first (empty ones last), then a stable sort by score: equal scores keep the
    # smaller id first.
    by_id = torch.sort(torch.where(ids < 0, torch.iinfo(torch.int64).max, ids), dim=1,
                       stable=True).indices
    scores, ids = scores.gather(1, by_id), ids.gather(1, by_id)
    # An empty candidate never outranks a real one, whatever the real one's score.
    scores = torch.where(ids < 0, float("-inf"), scores)
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices
    k = min(out.shape[1], order.shape[1])
    out[:, :k] = ids.gather(1, order[:, :k])
    out[:, k:] = -1
