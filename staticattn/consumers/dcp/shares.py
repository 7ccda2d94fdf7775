"""Per-rank SWA windows and dense shares under decode context parallelism, as an option
beside replication (``vllm-0.33-extras.md`` §7.2).

By default every rank builds and attends the single-GPU SWA window and every dense entry
(replicated, ``docs/architecture.md``). A step that shards that attendance instead calls
:class:`DCPRankShares` on the step's SWA metadata: it writes, inside the graph and into
buffers it owns, the rank's part of each decode row (:mod:`staticattn.kernels.dcp.rank_shares`)
-- the owned window positions at their replicated SWA slots, and the owned dense entries
(sharded by entry, interleave 1) at their local slots -- and, for the cache writes of
that layout, the slot each token writes its completed dense entry to on this rank (-1 on
the others). The ranks' partial attentions then merge by log-sum-exp as the decode
consumer's do.

Example::

    shares = DCPRankShares(rank_config)
    out = shares(batch, md)  # out["swa"], out["swa_lens"], out["dense"], ...
"""

from __future__ import annotations

import torch

from staticattn.arena import ArenaConfig, cdiv
from staticattn.builders.batch import Batch
from staticattn.errors import ConfigError
from staticattn.kernels.dcp.ownership import DCPShard
from staticattn.kernels.dcp.rank_shares import dense_rank_share, swa_rank_share
from staticattn.kernels.indexer.index_slots import compressed_slot_mapping
from staticattn.kernels.runtime.backend import resolve_backend

__all__ = ["DCPRankShares"]


class DCPRankShares:
    """Callable ``(batch, md) -> dict`` of the rank's shares for the step of ``md["swa"]``.

    Parameters
    ----------
    config : ArenaConfig
        The rank's config (``dcp_world_size``, ``dcp_rank``); a model with SWA layers.
    swa_interleave : int
        Tokens per ownership group of the window's positions (1, as the reference's V4 DCP).

    Returns (per call) views of owned buffers, valid until the next call: ``"swa"`` int32
    ``(Td, W)`` global SWA slots, -1 after ``"swa_lens"`` int32 ``(Td,)``; ``"dense"`` int32
    ``(Td, cdiv(maxC, world))`` local dense slots through the rank's main block table
    (``block_size // 128`` local entries a page), -1 after ``"dense_lens"``; and
    ``"dense_slots"`` int64 ``(T,)``, the local slot each token writes its completed dense
    entry to (``(p + 1) % 128 == 0`` and the entry is this rank's), else -1. The dense ones
    are None without dense layers.
    """

    def __init__(self, config: ArenaConfig, *, swa_interleave: int = 1) -> None:
        if not config.has_swa:
            raise ConfigError("per-rank SWA shares need a model with a sliding window")
        self.world, self.rank = config.dcp_world_size, config.dcp_rank
        self.swa_interleave = swa_interleave
        dense = config.dense_layer_type
        self.entries_per_block = (dense.entries_per_block(config.block_size)
                                  if dense is not None else 0)
        dev, td = config.torch_device, config.max_decode_tokens
        self.backend = resolve_backend(config.kernel_backend, dev)
        i32 = dict(dtype=torch.int32, device=dev)
        self._swa = torch.full((td, config.sliding_window), -1, **i32)
        self._swa_lens = torch.zeros(td, **i32)
        self._dense = self._dense_lens = None
        if dense is not None:
            self._dense = torch.full((td, cdiv(config.dense_width, self.world)), -1, **i32)
            self._dense_lens = torch.zeros(td, **i32)
            self._dense_slots = torch.full((config.max_num_batched_tokens,), -1,
                                           dtype=torch.int64, device=dev)
        self.dense_ratio = dense.compress_ratio if dense is not None else 0

    def __call__(self, batch: Batch, md: dict):
        swa = md["swa"]
        td = swa.num_decode_tokens
        rows = swa.decode_swa_indices.view(td, swa.decode_swa_indices.shape[-1])
        out, lens = self._swa[:td], self._swa_lens[:td]
        swa_rank_share(self.backend, rows, swa.decode_swa_lens, batch.positions, out, lens,
                       num_rows=td, world=self.world, rank=self.rank,
                       interleave=self.swa_interleave)
        shares = {"swa": out, "swa_lens": lens, "dense": None, "dense_lens": None,
                  "dense_slots": None}
        if self._dense is None or swa.dense_decode_lens is None:
            return shares
        c_out, c_lens = self._dense[:td], self._dense_lens[:td]
        dense_rank_share(self.backend, swa.dense_decode_lens, swa.token_to_req_indices,
                         batch.block_table, c_out, c_lens, num_rows=td,
                         entries_per_block=self.entries_per_block, world=self.world,
                         rank=self.rank)
        # The writer side of the same layout: entries dealt at interleave 1.
        nt = batch.num_actual_tokens
        slots = self._dense_slots[:nt]
        compressed_slot_mapping(
            self.backend, batch.query_start_loc, batch.positions, batch.token_to_req,
            batch.block_table, slots, num_reqs=batch.num_reqs, num_tokens=nt,
            storage_block_size=self.entries_per_block, compress_ratio=self.dense_ratio,
            dcp=DCPShard(self.world, self.rank, 1))
        shares.update(dense=c_out, dense_lens=c_lens, dense_slots=slots)
        return shares
