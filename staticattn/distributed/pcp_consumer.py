"""The emulated attention step under prefill context parallelism, and its single-GPU twin
(``prefill-context-parallel.md`` §3.3, §2.3, §4.2): what a layer does with the rank's
metadata, reduced to its data movement.

A PCP rank, per step, inside its graph:

1. **new keys** of its ``N`` local tokens: ``new_keys(request state, position)``
   (:mod:`staticattn.distributed.step_keys`; a stand-in for the K a layer computes from
   each token);
2. **all-gather** of the ``N`` keys over the PCP group into ``P * N`` rank-major rows
   (fixed size: every rank pads to ``N``; NCCL inside the graph, gloo eagerly on CPU);
3. **cache write** of every gathered row at the gathered slot mapping (PAD rows -- padding,
   and under DCP the copies that are not canonical -- write nothing): every rank's cache
   then holds the step's keys of every token (§3.3);
4. the :class:`~staticattn.consumers.emulated.gather.GatherConsumer` over the rank's rows
   (each local token's checksums through the rank's metadata);
5. where the model has a ratio-2 compressor ring (DeepSeek V4.1), the **compressor**
   (:class:`~staticattn.distributed.pcp_ring_layer.PCPRingCompressor`): each local token's
   2-token group value, its first half through the ring links or the ring, in one more
   column (``"compressor"``); the rows' last keys **all-gathered**, the open groups saved;
6. **all-gather** of the ``N`` output rows and the **restore** to global token order
   with ``hidden_restore_idx`` (§2.3), rows past the step's tokens 0.

The single-GPU twin writes ``new_keys`` at the global slot mapping and runs the same
consumer (and compressor twin) over the global batch: its rows must equal the restored
rows, token for token. Before a step the engine's stand-in
(:func:`~staticattn.distributed.step_keys.write_context`) writes each request's context
keys, the same function of its state and position, into every cache (the rank's shard
under DCP), so the caches hold the same keys whatever their first contents.
"""

from __future__ import annotations

import torch

from staticattn.arena import ArenaConfig
from staticattn.builders.batch import Batch
from staticattn.builders.pcp.rank_views import PCPViews
from staticattn.builders.pcp.ring_link import ring_table
from staticattn.consumers.emulated.gather import GatherConsumer
from staticattn.distributed.pcp_exchange import RankExchange
from staticattn.distributed.pcp_ring_layer import (
    COMPRESSOR_COLUMN,
    PCPRingCompressor,
    SingleRingCompressor,
)
from staticattn.distributed.step_keys import new_keys, write_keys

__all__ = ["PCPGatherStep", "SingleGatherStep", "written_cache"]


def written_cache(consumer: GatherConsumer) -> torch.Tensor:
    """The cache a step's new keys go to, int32 ``(entries,)`` by the batch's slot mapping:
    the window's (``swa``, its group's slots) where the model has one (DeepSeek V4.1), else
    the indexer's (V3.2, ratio 1: the main group's slots)."""
    return consumer.caches["swa" if consumer.config.has_swa else "indexer"]


class PCPGatherStep:
    """Step ``(batch, md) -> (T, columns)`` int64 of one PCP rank: steps 1-5 of the module.

    Parameters
    ----------
    config : ArenaConfig
        The rank's arena config (its ``R`` rows and ``N`` tokens).
    views : PCPViews
        The rank's PCP views (gathered slots, restore index, the staged batch).
    rank, world : int
        PCP rank and size.
    group : ProcessGroup or None
        The PCP group (None: the default group).
    num_kv_blocks, seed : int
        The consumer's caches (:class:`GatherConsumer`) and the compressor ring's blocks;
        the single-GPU twin takes the same.

    Attributes
    ----------
    consumer : GatherConsumer
    compressor : PCPRingCompressor or None
        Where the rank's views have the ring links (DeepSeek V4.1).
    columns : list of str
        The consumer's columns, then ``"compressor"`` where there is a compressor.
    out : int64 ``(T, columns)``, the restored rows of the last step.
    """

    def __init__(self, config: ArenaConfig, views: PCPViews, rank: int, world: int, group,
                 num_kv_blocks: int, seed: int = 0) -> None:
        self.views, self.rank, self.world, self.group = views, rank, world, group
        self.consumer = GatherConsumer(config, num_kv_blocks, seed, backend="torch"
                                       if config.torch_device.type == "cpu" else None)
        self.compressor = (None if views.ring is None else
                           PCPRingCompressor(views, rank, world, group, num_kv_blocks))
        self.columns = self.consumer.columns + ([] if self.compressor is None
                                                else [COMPRESSOR_COLUMN])
        self.exchanged = RankExchange(views, rank, world, group, len(self.columns),
                                      config.torch_device)

    @property
    def out(self) -> torch.Tensor:
        """The restored rows of the last step, int64 ``(T, columns)``."""
        return self.exchanged.out

    @property
    def cache(self) -> torch.Tensor:
        """The keys the step writes and reads, int32 ``(entries,)`` by slot: the window's
        (``swa``) where the model has one, else the indexer's."""
        return written_cache(self.consumer)

    def exchange(self) -> None:
        """The step's collectives alone (the bench times them): every all-gather."""
        self.exchanged.gather_keys()
        if self.compressor is not None:
            self.compressor.exchange()
        self.exchanged.gather_rows()

    def __call__(self, batch: Batch, metadata: dict) -> torch.Tensor:
        x = self.exchanged
        x.share_keys(batch, self.cache)
        mine, N = x.mine, x.keys.shape[1]
        mine[:, :len(self.consumer.columns)].copy_(self.consumer(batch, metadata)[:N])
        if self.compressor is not None:
            self.compressor(batch, x.keys[self.rank], mine[:, -1])
        return x.restore()


class SingleGatherStep:
    """The single-GPU twin: step ``(batch, md) -> (num_tokens, columns)`` int64, the
    global batch's new keys (of ``token_states``, which the engine writes) written at its
    slot mapping, then the consumer and, where the model has a ratio-2 compressor ring, the
    compressor twin (:class:`~staticattn.distributed.pcp_ring_layer.SingleRingCompressor`)
    in the last column.

    Parameters
    ----------
    config : ArenaConfig
        The one-rank arena's config (every request, every token).
    num_kv_blocks, seed : int
        As the ranks' (equal caches and rings to start with).

    Attributes
    ----------
    consumer : GatherConsumer
    compressor : SingleRingCompressor or None
    columns : list of str
        As the ranks' (:attr:`PCPGatherStep.columns`).
    """

    def __init__(self, config: ArenaConfig, num_kv_blocks: int, seed: int = 0) -> None:
        self.consumer = GatherConsumer(config, num_kv_blocks, seed, backend="torch"
                                       if config.torch_device.type == "cpu" else None)
        self.keys = torch.zeros(config.max_num_batched_tokens, dtype=torch.int32,
                                device=config.torch_device)
        #: Each token's request state index, written by the engine before the step.
        self.token_states = torch.zeros_like(self.keys)
        ring = ring_table(config) is not None
        self.compressor = SingleRingCompressor(config, num_kv_blocks) if ring else None
        self.columns = self.consumer.columns + ([COMPRESSOR_COLUMN] if ring else [])
        self.out = (torch.zeros(config.max_num_batched_tokens, len(self.columns),
                                dtype=torch.int64, device=config.torch_device)
                    if ring else None)

    @property
    def cache(self) -> torch.Tensor:
        """The cache the step writes (as the rank's, :func:`written_cache`)."""
        return written_cache(self.consumer)

    def __call__(self, batch: Batch, metadata: dict) -> torch.Tensor:
        n = batch.num_actual_tokens
        keys = new_keys(self.token_states[:n], batch.positions[:n], self.keys[:n])
        write_keys(self.cache, batch.slot_mapping[:n], keys)
        rows = self.consumer(batch, metadata)
        if self.compressor is None:
            return rows
        out = self.out[:n]
        out[:, :-1].copy_(rows)
        self.compressor(batch, keys, out[:, -1])
        return out
