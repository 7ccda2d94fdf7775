"""DeepSeek V3.2's sparse MLA over every token of a step as one batch of FlashMLA's sparse FP8
decode: the reference's "mixed batch" mode (``flashmla_sparse.py``: "use the FP8 decode
kernel for both prefill and decode ... treating all tokens as single batch"), the path its
FlashMLA-sparse backend takes under decode context parallelism alone.

Each of the step's ``T`` tokens -- decode and prefill alike -- is a batch row of one query,
its slots read through its request's block row (``batch.token_to_req``) and bounded by its
own position (``batch.positions``: a token at position ``p`` sees keys ``j <= p``)::

    slots[t, i] = block_table[req[t], j // 64] * 64 + j % 64          # j = topk[t, i]
                  (-1 where j < 0, j > positions[t] or j // 64 past the table)
    out[:T], lse = flash_mla_with_kvcache(q[:T] (T, 1, H, 576), kv_cache, ...,
                                          indices=slots (T, 1, K))

Under decode context parallelism (``D`` ranks, interleave ``I``; ``prefill-context-
parallel.md`` §3.6) each rank keeps the top-k entries it holds, at their local indices
through its own block table, bounded by its share of the token's keys
(:func:`~staticattn.kernels.dcp.ownership.dcp_local_count` of ``p + 1``); the partial outputs
merge over the DCP group by their log-sum-exps, as the decode consumer's do
(:class:`~staticattn.consumers.real.sparse_mla_decode.SparseMLADecode`, whose buffers and
merge this class shares). A prefill token needs no other rank's queries: under DCP alone every
rank holds the whole batch. The top-k rows are the indexer's global ones
(:class:`~staticattn.consumers.real.indexer_topk.IndexerTopKStep` with ``prefill=True``
merges them over the same group).

Graph-safe as the decode consumer: fixed shapes per captured size or bucket, no host read,
owned buffers, the tile-scheduler holder made inside the step. A mixed build's rows past the
step's real tokens (``step_counts[1]``) are left as they were.

Memory: the decode consumer's, with ``max_num_batched_tokens`` rows in place of
``max_decode_tokens``; under DCP the partial outputs ``T x H x 512`` fp32 (at V3.2's
capacities, 8192 tokens and 128 heads: 2 GiB, as the reference's merge needs per step).
"""

from __future__ import annotations

from typing import Any

import torch

from staticattn.arena import ArenaConfig
from staticattn.builders.batch import Batch
from staticattn.consumers.real.caches import DS_MLA_BLOCK
from staticattn.consumers.real.sparse_mla_decode import SparseMLADecode
from staticattn.errors import InvalidBatchError
from staticattn.kernels.dcp.ownership import dcp_local_count

__all__ = ["SparseMLAMixedBatch"]


class SparseMLAMixedBatch(SparseMLADecode):
    """Attends every token of a step over the cache slots of its top-k positions.

    Parameters are :class:`SparseMLADecode`'s; ``q`` holds a row per token of the step (bf16
    ``(>= max_num_batched_tokens, H, 576)``). Its :attr:`slots`, :attr:`partial` and
    :attr:`lse` have ``max_num_batched_tokens`` rows.
    """

    @staticmethod
    def capacity(config: ArenaConfig) -> int:
        """Rows it attends at most: the step's tokens."""
        return config.max_num_batched_tokens

    def attend_into(self, batch: Batch, topk: torch.Tensor, out: torch.Tensor,
                    sched: Any = None) -> None:
        """Write the attention of every token of ``batch`` into ``out`` (bf16 ``(>= T, H,
        512)``), from its top-k row in ``topk`` (int32 ``(>= T, K)``, request-relative key
        positions, -1 for none). ``sched`` as :meth:`SparseMLADecode.attend_into`. Under DCP
        every rank of the group calls it for the same step."""
        o = self.attend_local(batch, topk, sched)
        self.write(batch, self.merged(o), out)

    def attend_local(self, batch: Batch, topk: torch.Tensor, sched: Any = None) -> torch.Tensor:
        """This rank's attention of the ``T`` tokens over the top-k entries it holds: bf16
        ``(T, H, 512)``; under DCP also in :attr:`partial` and ``lse[dcp_rank]``."""
        if batch.positions is None or batch.token_to_req is None:
            raise InvalidBatchError("the mixed-batch sparse MLA reads each token's position "
                                    "and request: this batch carries neither")
        return self.attend_slots(self.token_slots(batch, topk[: batch.num_actual_tokens]),
                                 sched)

    def write(self, batch: Batch, o: torch.Tensor, out: torch.Tensor) -> None:
        """The tokens' rows ``o`` (bf16 or fp32 ``(T, H, 512)``) into ``out``; rows past the
        step's real tokens (a mixed build's ``step_counts[1]``) are left as they were."""
        counts = batch.step_counts
        self.write_rows(o, out, None if counts is None else counts[1])

    def token_slots(self, batch: Batch, topk: torch.Tensor) -> torch.Tensor:
        """int32 ``(T, K)`` (a view of :attr:`slots`): the flat cache slot of every top-k
        entry of the ``T`` tokens, from ``topk`` (int32 ``(T, K)``); -1 for an entry below 0,
        past the token's position, past its block-table row, and under DCP for one another
        rank holds."""
        n = topk.shape[0]
        table = batch.block_table
        lens = self._lens[:n]
        # The token's keys, 0..p (V3.2 indexes every token: R = 1); under DCP its rank's.
        torch.add(batch.positions[:n], 1, out=lens)
        lens.copy_(dcp_local_count(lens, self.world, self.rank, self.interleave))
        lens.clamp_(max=table.shape[1] * DS_MLA_BLOCK)
        local, at, valid = self.held_entries(topk, lens, table.shape[1])
        # block_table[req, col] through the table's own strides (an arena view).
        at.add_(batch.token_to_req[:n].view(n, 1).long() * table.stride(0))
        span = (table.shape[0] - 1) * table.stride(0) + table.shape[1]
        slots = self.slots[:n]
        torch.index_select(table.as_strided((span,), (1,)), 0, at.view(-1),
                           out=slots.view(-1))
        return self.finish_slots(local, valid, slots)
