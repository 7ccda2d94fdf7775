"""The emulated attention step under prefill context parallelism with the KV sharded over
the same ranks (PCP + DCP, ``D = P``; ``prefill-context-parallel.md`` §3.3, §3.5, §3.7).

Per step, on a rank (DCP rank ``d``), inside its graph -- every collective over the one
group that is both the PCP and the DCP group, on fixed-size buffers:

1. **new keys** of the ``N`` local tokens (:func:`~staticattn.distributed.step_keys.
   new_keys`), **all-gathered** (``P * N``) and written at the gathered slot mapping of DCP
   rank ``d``: the cache holds this rank's shard of every token, at local indices;
2. **decode rows** (first, replicated on every rank): each token's checksum -- the sum of
   the last ``min(L, 32)`` keys of its ``L`` -- as this rank's part, through the indexer
   builder's localised decode lengths (``md["indexer"].decode.seq_lens``, the rank's share
   of ``L``): local keys ``i`` of global index ``dcp_global_index(i) >= L - 32``; the
   parts are **all-reduced** (summed) over the ranks;
3. **prefill rows**: the global chunk plan of :mod:`~staticattn.builders.pcp.kv_plan`
   (one chunk): each request's shard gathered into a workspace of ``W`` entries
   (``local_cu_seq_lens``), **all-gathered** (``D * W``), put in global order by
   ``deinterleave_idx`` (its rank stride, the padded local total, mapped to ``W``), and
   each token's checksum summed over ``[max(ks, ke - 32), ke)`` by prefix sums;
4. the ``N`` rows **all-gathered** and **restored** to global token order.

Only the indexer column is written (DeepSeek V3.2's others are 0, as the gather consumer
leaves them). The single-GPU step of :class:`~staticattn.distributed.pcp_consumer.
SingleGatherStep` must give the same rows.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from staticattn.arena import ArenaConfig
from staticattn.arena.pcp_config import PCPConfig
from staticattn.builders.batch import Batch
from staticattn.builders.pcp.rank_views import PCPViews
from staticattn.consumers.dcp.merge import gather_rank_major
from staticattn.distributed.pcp_exchange import RankExchange
from staticattn.kernels.dcp.ownership import dcp_global_index
from staticattn.kernels.staging.stage_inputs import COUNT_DECODE_TOKENS, COUNT_DECODES

__all__ = ["PCPDCPLayer"]

#: Keys a token's checksum sums (the gather consumer's window).
WINDOW = 32
#: The indexer column of the output (``swa``, ``dense``, ``indexer``).
COLUMNS, INDEX_COLUMN = 3, 2


class PCPDCPLayer:
    """Step ``(batch, md) -> (T, 3)`` int64 of one PCP + DCP rank (see the module).

    Parameters
    ----------
    pcp : PCPConfig
        ``dcp_size == pcp_size``.
    config : ArenaConfig
        The rank's arena config (its DCP rank, the interleave).
    views : PCPViews
        With the prefill extents (``views.extents``).
    group : ProcessGroup or None
        The PCP (= DCP) group; None: the default one.
    num_kv_blocks, seed : int
        The rank's cache: ``num_kv_blocks * block_size`` random entries.
    """

    def __init__(self, pcp: PCPConfig, config: ArenaConfig, views: PCPViews, group,
                 num_kv_blocks: int, seed: int = 0) -> None:
        self.views, self.group = views, group
        self.world, self.rank = pcp.pcp_size, config.dcp_rank
        self.interleave, self.block_size = pcp.cp_kv_cache_interleave_size, config.block_size
        dev = config.torch_device
        gen = torch.Generator(device="cpu").manual_seed(seed + 1 + self.rank)
        #: The rank's shard of the index keys, flat, by local slot.
        self.cache = torch.randint(0, 1 << 20, (num_kv_blocks * config.block_size,),
                                   generator=gen, dtype=torch.int32).to(dev)
        N = views.rows.token_to_global.shape[1]
        W = views.extents.deinterleave_idx.numel()
        self.exchanged = RankExchange(views, self.rank, self.world, group, COLUMNS, dev)
        self.workspace = torch.zeros(self.world, W, dtype=torch.int64, device=dev)
        self.decode_part = torch.zeros(N, dtype=torch.int64, device=dev)
        self._window = torch.arange(WINDOW, device=dev)

    @property
    def out(self) -> torch.Tensor:
        """The restored rows of the last step, int64 ``(T, 3)``."""
        return self.exchanged.out

    def exchange(self) -> None:
        """The step's collectives alone (the bench times them)."""
        self.exchanged.gather_keys()
        dist.all_reduce(self.decode_part, group=self.group)
        gather_rank_major(self.workspace, self.world, self.rank, self.group)
        self.exchanged.gather_rows()

    def _slots(self, table: torch.Tensor, rows: torch.Tensor, local: torch.Tensor):
        """The local slot of local index ``local`` of block-table row ``rows`` (int64, any
        equal shapes), both clamped into the table: the caller masks what lies past."""
        bs = self.block_size
        rows = rows.clamp(0, table.shape[0] - 1)
        local = local.clamp(0, table.shape[1] * bs - 1)
        return table.long()[rows, local // bs] * bs + local % bs

    def __call__(self, batch: Batch, metadata: dict) -> torch.Tensor:
        x = self.exchanged
        x.share_keys(batch, self.cache)
        N = x.keys.shape[1]
        qsl = batch.query_start_loc.long()
        # The rank's decode rows and their tokens, as write_local_inputs staged them.
        nd_rows = batch.step_counts[COUNT_DECODES].long()
        nd_tokens = batch.step_counts[COUNT_DECODE_TOKENS].long()
        self._decodes(batch, metadata["indexer"].decode.seq_lens[:, 0], nd_tokens)
        prefill = self._prefills(batch, nd_rows, nd_tokens)
        t = torch.arange(N, device=qsl.device)
        row = x.mine
        row.zero_()
        row[:, INDEX_COLUMN].copy_(torch.where(t < nd_tokens, self.decode_part, prefill))
        return x.restore()

    def _decodes(self, batch: Batch, local_lens: torch.Tensor, nd_tokens) -> None:
        """Step 2: decode token ``t`` of global length ``L = position + 1`` holds
        ``local_lens[t]`` keys here (the builder flattens MTP's decode rows into a row a
        token); the last ``WINDOW`` of them cover every key of this rank among the global
        last ``WINDOW``. Its keys are at its request row's slots (``token_to_req``)."""
        N = self.decode_part.numel()
        t = torch.arange(N, device=local_lens.device)
        row = batch.token_to_req[:N].long()
        lens = torch.where(t < local_lens.numel(), local_lens.long()[t.clamp(
            max=local_lens.numel() - 1)], 0)
        local = lens[:, None] - WINDOW + self._window                       # (N, WINDOW)
        first = batch.positions[:N].long()[:, None] + 1 - WINDOW
        mine = (local >= 0) & (dcp_global_index(local.clamp(min=0), self.world, self.rank,
                                                self.interleave) >= first)
        keys = self.cache[self._slots(batch.block_table, row[:, None].expand_as(local),
                                      local)].long()
        part = torch.where(mine & (t < nd_tokens)[:, None], keys, 0).sum(1)
        self.decode_part.copy_(part)
        dist.all_reduce(self.decode_part, group=self.group)

    def _prefills(self, batch: Batch, nd_rows, nd_tokens) -> torch.Tensor:
        """Step 3: each local token's prefill checksum (0 for decode tokens), int64 ``(N,)``."""
        ext, W = self.views.extents, self.workspace.shape[1]
        dev = ext.ks.device
        region, key, live = ext.shard_rows(torch.arange(W, device=dev))
        # Region k's first prefill row is the rank row nd + k: its block row gives the slots.
        keys = self.cache[self._slots(batch.block_table, nd_rows + region, key)]
        self.workspace[self.rank].copy_(torch.where(live, keys, 0))
        gather_rank_major(self.workspace, self.world, self.rank, self.group)
        ordered = self.workspace.view(-1).index_select(0, ext.gathered_rows(W))
        prefix = torch.cat([ordered.new_zeros(1), torch.cumsum(ordered, 0)])
        ks, ke = ext.ks.long(), ext.ke.long()
        sums = prefix[ke] - prefix[torch.maximum(ks, ke - WINDOW)]
        # Prefill token u is local token nd_tokens + u.
        t = torch.arange(ks.numel(), device=dev)
        u = (t - nd_tokens).clamp(min=0)
        return torch.where(t >= nd_tokens, sums[u], 0)
