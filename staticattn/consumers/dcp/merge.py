"""The exact global top-k of rows whose keys are sharded over decode-context-parallel ranks,
for prefill rows as well as decode rows (``vllm-0.33-extras.md`` §7.1).

Each rank hands its local top-k of every row (local indices into the keys it holds) and the
scores it ranked them by; :class:`DCPTopKMerge` packs them as ``(score, global id)``
candidates (:func:`~staticattn.kernels.dcp.topk_merge.pack_candidates`), all-gathers them over the
group into a buffer it owns and merges them into the global top-k, the same on every rank.
A prefill chunk's rows pass their full-width logits with ``row_starts`` (their
``cu_seqlen_ks``), or row-local logits without; decode rows row-local logits. A top-k
that comes with its scores (a top-k kernel's values) merges in phases:
:meth:`DCPTopKMerge.pack`, :meth:`~DCPTopKMerge.exchange`, :meth:`~DCPTopKMerge.merged`.

Example (two ranks, each with its own group member)::

    merge = DCPTopKMerge(cfg, group, topk=2048, local_k=2048, max_rows=8192)
    ids = merge(local_topk, logits, row_starts=chunk.cu_seqlen_ks)  # (rows, 2048) int64
    merge.pack(local_topk, topk_values); merge.exchange(rows)       # the same, scored
    ids = merge.merged(rows)

Memory: the exchange buffer holds ``world x max_rows x local_k`` candidates of 8 bytes, a
float32 score and id as the reference packs them (an id, below ``cdiv(max_model_len, R)``, is
exact in float32 up to ``2 ** 24``: a longer context is a ``ConfigError``), the merged ids
``max_rows x topk`` int64. DeepSeek V3.2's defaults with the prefill rows (8192 tokens, top
2048) on two ranks: 256 MiB.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from staticattn.arena import ArenaConfig, cdiv
from staticattn.errors import ConfigError, InvalidBatchError
from staticattn.kernels.dcp.topk_merge import merge_candidates, pack_candidates, pack_scored

__all__ = ["DCPTopKMerge", "EXACT_IDS", "gather_rank_major"]

#: Integers float32 holds exactly: the merge's candidate ids stay below it.
EXACT_IDS = 2 ** 24

#: ``(output, input, group=)``: the in-place all-gather into one tensor (its newer name
#: where this torch has it).
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def gather_rank_major(buffer: torch.Tensor, world: int, rank: int, group=None) -> None:
    """Every rank's ``buffer[rank]`` into ``buffer[r]`` of every rank, in place; nothing at
    world 1.

    Parameters
    ----------
    buffer : device tensor ``(world, n, ...)``, any dtype, contiguous
        One contiguous block per rank (rank-major).
    world, rank : int
    group : ProcessGroup, optional
    """
    if world == 1:
        return
    whole = buffer.view(world * buffer.shape[1], *buffer.shape[2:])
    _all_gather(whole, buffer[rank], group=group)


class DCPTopKMerge:
    """Callable ``(local_topk, logits, row_starts=None) -> int64 (n, topk)`` global ids.

    Parameters
    ----------
    config : ArenaConfig
        The rank's config (``dcp_world_size``, ``dcp_rank``, the interleave).
    group : ProcessGroup, optional
        The DCP group (NCCL, or gloo on CPU); None for the default group.
    topk : int
        ``K``, the global width.
    local_k : int
        The width of each rank's local top-k (``min(K, local keys)`` makes the merge exact).
    max_rows : int
        Rows of a call at most (the exchange buffer's capacity).
    ratio : int, optional
        The compress ratio of the keys (default the indexer's): keys are dealt at
        interleave ``I // R``.
    """

    def __init__(self, config: ArenaConfig, group=None, *, topk: int, local_k: int,
                 max_rows: int, ratio: int | None = None) -> None:
        self.world, self.rank, self.group = config.dcp_world_size, config.dcp_rank, group
        ratio = ratio or config.index_compress_ratio
        if cdiv(config.max_model_len, ratio) > EXACT_IDS:
            raise ConfigError(
                f"max_model_len={config.max_model_len}: the merge packs key positions as "
                f"float32, exact below {EXACT_IDS} keys (compress ratio {ratio})")
        self.interleave = config.dcp_entry_interleave(ratio)
        self.topk, self.local_k, self.max_rows = topk, local_k, max_rows
        dev = config.torch_device
        self._cand = torch.zeros(self.world * max_rows * local_k * 2, dtype=torch.float32,
                                 device=dev)
        self._ids = torch.full((max_rows, topk), -1, dtype=torch.int64, device=dev)

    def __call__(self, local_topk: torch.Tensor, logits: torch.Tensor,
                 row_starts: torch.Tensor | None = None) -> torch.Tensor:
        """``local_topk`` int ``(n, local_k)`` (-1 = none), ``logits`` float ``(n, cols)``,
        ``row_starts`` int ``(n,)`` or None; returns a view of an owned int64 ``(n, topk)``
        buffer, valid until the next call."""
        n = self._check(local_topk)
        pack_candidates(local_topk, logits, row_starts, self.candidates(n)[self.rank],
                        world=self.world, rank=self.rank, interleave=self.interleave)
        self.exchange(n)
        return self.merged(n)

    # The phases of a local top-k that comes with its scores (a top-k kernel's values):
    # pack, exchange (every rank), merged; a caller in one process plays the exchange.
    def pack(self, local_topk: torch.Tensor, scores: torch.Tensor) -> None:
        """This rank's candidates of ``n`` rows into ``candidates(n)[dcp_rank]``:
        ``local_topk`` int ``(n, local_k)`` (-1 = none), ``scores`` float32 ``(n, local_k)``
        aligned with it."""
        n = self._check(local_topk)
        pack_scored(local_topk, scores, self.candidates(n)[self.rank], world=self.world,
                    rank=self.rank, interleave=self.interleave)

    def candidates(self, n: int) -> torch.Tensor:
        """float32 ``(world, n, local_k, 2)``: every rank's candidates of ``n`` rows,
        rank-major (``[dcp_rank]`` this rank's)."""
        return self._cand[: self.world * n * self.local_k * 2].view(
            self.world, n, self.local_k, 2)

    def merged(self, n: int) -> torch.Tensor:
        """The global top-k of ``n`` rows from :meth:`candidates`: a view of an owned int64
        ``(n, topk)`` buffer."""
        out = self._ids[:n]
        merge_candidates(self.candidates(n), out)
        return out

    def exchange(self, n: int) -> None:
        """Every rank's candidates of ``n`` rows into :meth:`candidates` (the all-gather
        over the group; every rank of it calls this for the same ``n``)."""
        gather_rank_major(self.candidates(n), self.world, self.rank, self.group)

    def _check(self, local_topk: torch.Tensor) -> int:
        n = local_topk.shape[0]
        if n > self.max_rows or local_topk.shape[1] != self.local_k:
            raise InvalidBatchError(
                f"local_topk must be (<= {self.max_rows}, {self.local_k}) (rows, local_k), "
                f"got {tuple(local_topk.shape)}")
        return n
