"""The emulated attention step under prefill context parallelism, and its single-GPU twin
(``prefill-context-parallel.md`` §3.3, §2.3): what a layer does with the rank's metadata,
reduced to its data movement.

A PCP rank, per step, inside its graph:

1. **new keys** of its ``N`` local tokens: ``new_keys(request state, position)`` (a
   stand-in for the K a layer computes from each token);
2. **all-gather** of the ``N`` keys over the PCP group into ``P * N`` rank-major rows
   (fixed size: every rank pads to ``N``; NCCL inside the graph, gloo eagerly on CPU);
3. **cache write** of every gathered row at the gathered slot mapping (PAD rows -- padding,
   and under DCP the copies that are not canonical -- write nothing): every rank's cache
   then holds the step's keys of every token (§3.3);
4. the :class:`~staticattn.consumers.emulated.gather.GatherConsumer` over the rank's rows
   (each local token's checksums through the rank's metadata);
5. **all-gather** of the ``N`` checksum rows and the **restore** to global token order
   with ``hidden_restore_idx`` (§2.3), rows past the step's tokens 0.

The single-GPU twin writes ``new_keys`` at the global slot mapping and runs the same
consumer over the global batch: its rows must equal the restored rows, token for token.
Before a step the engine's stand-in (:func:`write_context`) writes each request's context
keys, the same function of its state and position, into every cache (the rank's shard
under DCP), so the caches hold the same keys whatever their first contents.
"""

from __future__ import annotations

import torch

from staticattn.arena import ArenaConfig
from staticattn.builders.batch import Batch
from staticattn.builders.pcp.rank_views import PCPViews
from staticattn.consumers.dcp.merge import gather_rank_major
from staticattn.consumers.emulated.gather import GatherConsumer
from staticattn.kernels.dcp.ownership import dcp_local_index, dcp_owner

__all__ = ["PCPGatherStep", "SingleGatherStep", "new_keys", "write_context", "write_keys",
           "written_cache"]

#: Keys are 20-bit values, as the consumer's random caches hold.
_KEY_MASK = (1 << 20) - 1


def new_keys(states: torch.Tensor, positions: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The key of each token, int32 ``out`` ``(n,)`` from its request's state index (int
    ``states`` ``(n,)``) and its position (int ``positions`` ``(n,)``): a hash of both, so a
    key at a wrong slot, of a wrong token or missing shows."""
    return out.copy_((states.long() * 7919 + positions.long() * 40503 + 12345) & _KEY_MASK)


def write_context(cache: torch.Tensor, table_row: torch.Tensor, state: int, count: int,
                  block_size: int, world: int = 1, rank: int = 0, interleave: int = 1) -> None:
    """Write the keys of positions ``[0, count)`` of a request (its state index ``state``,
    its block row int32 ``table_row`` ``(W,)``) into ``cache`` (int32 ``(entries,)``): all
    of them, or under DCP (``world > 1``) those ``rank`` holds, at their local index."""
    pos = torch.arange(count, device=cache.device)
    local = dcp_local_index(pos, world, interleave) if world > 1 else pos
    slots = table_row.long()[local // block_size] * block_size + local % block_size
    if world > 1:
        slots = torch.where(dcp_owner(pos, world, interleave) == rank, slots, -1)
    keys = new_keys(torch.full_like(pos, state), pos, torch.empty_like(pos, dtype=torch.int32))
    write_keys(cache, slots, keys)


def write_keys(cache: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor) -> None:
    """``cache[slots[i]] = keys[i]`` where ``slots[i] >= 0``; graph-safe (no boolean
    indexing): PAD rows rewrite entry 0, a slot of the null block (block 0), with its own
    value. int32 ``cache`` ``(entries,)`` and ``keys`` ``(n,)``, int64 ``slots`` ``(n,)``."""
    live = slots >= 0
    index = torch.where(live, slots, 0)
    cache.scatter_(0, index, torch.where(live, keys, cache[0]))


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
        The consumer's caches (:class:`GatherConsumer`); the single-GPU twin takes the same.

    Attributes
    ----------
    consumer : GatherConsumer
    out : int64 ``(T, columns)``, the restored rows of the last step.
    """

    def __init__(self, config: ArenaConfig, views: PCPViews, rank: int, world: int, group,
                 num_kv_blocks: int, seed: int = 0) -> None:
        self.views, self.rank, self.world, self.group = views, rank, world, group
        self.consumer = GatherConsumer(config, num_kv_blocks, seed, backend="torch"
                                       if config.torch_device.type == "cpu" else None)
        N = views.rows.token_to_global.shape[1]
        dev, cols = config.torch_device, len(self.consumer.columns)
        self.keys = torch.zeros(world, N, dtype=torch.int32, device=dev)
        self.rows = torch.zeros(world, N, cols, dtype=torch.int64, device=dev)
        T = views.rows.hidden_restore_idx.numel()
        self.out = torch.zeros(T, cols, dtype=torch.int64, device=dev)
        self._token = torch.arange(T, device=dev)

    @property
    def cache(self) -> torch.Tensor:
        """The keys the step writes and reads, int32 ``(entries,)`` by slot: the window's
        (``swa``) where the model has one, else the indexer's."""
        return written_cache(self.consumer)

    def exchange(self) -> None:
        """The step's collectives alone (the bench times them): both all-gathers."""
        gather_rank_major(self.keys, self.world, self.rank, self.group)
        gather_rank_major(self.rows, self.world, self.rank, self.group)

    def __call__(self, batch: Batch, metadata: dict) -> torch.Tensor:
        N = self.keys.shape[1]
        states = self.views.fields.req_idx.index_select(0, batch.token_to_req[:N].long())
        new_keys(states, batch.positions[:N], self.keys[self.rank])
        gather_rank_major(self.keys, self.world, self.rank, self.group)
        write_keys(self.cache, self.views.gathered_slots, self.keys.view(-1))
        self.rows[self.rank].copy_(self.consumer(batch, metadata)[:N])
        gather_rank_major(self.rows, self.world, self.rank, self.group)
        restore = self.views.rows.hidden_restore_idx.long()
        flat = self.rows.view(-1, self.rows.shape[-1])
        tokens = self.views.staged("query_start_loc")[-1]
        self.out.copy_(torch.where((self._token < tokens)[:, None],
                                   flat.index_select(0, restore), 0))
        return self.out


class SingleGatherStep:
    """The single-GPU twin: step ``(batch, md) -> (num_tokens, columns)`` int64, the
    global batch's new keys (of ``token_states``, which the engine writes) written at its
    slot mapping, then the consumer.

    Parameters
    ----------
    config : ArenaConfig
        The one-rank arena's config (every request, every token).
    num_kv_blocks, seed : int
        As the ranks' (equal caches to start with).
    """

    def __init__(self, config: ArenaConfig, num_kv_blocks: int, seed: int = 0) -> None:
        self.consumer = GatherConsumer(config, num_kv_blocks, seed, backend="torch"
                                       if config.torch_device.type == "cpu" else None)
        self.keys = torch.zeros(config.max_num_batched_tokens, dtype=torch.int32,
                                device=config.torch_device)
        #: Each token's request state index, written by the engine before the step.
        self.token_states = torch.zeros_like(self.keys)

    @property
    def cache(self) -> torch.Tensor:
        """The cache the step writes (as the rank's, :func:`written_cache`)."""
        return written_cache(self.consumer)

    def __call__(self, batch: Batch, metadata: dict) -> torch.Tensor:
        n = batch.num_actual_tokens
        keys = new_keys(self.token_states[:n], batch.positions[:n], self.keys[:n])
        write_keys(self.cache, batch.slot_mapping[:n], keys)
        return self.consumer(batch, metadata)
