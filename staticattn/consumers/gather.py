"""A built-in consumer step: reads the metadata the way attention kernels do, for every token.

For every real token ``t`` (request ``b``, position ``p``) it gathers from three fake caches it
owns and writes one row of checksums into its own output ``(max_num_batched_tokens, 3)``
int64 (padded tokens: zeros):

* col 0, SWA: the sum of ``swa_cache`` over the slots of the token's window, positions
  ``[max(p - W + 1, 0), p]`` -- a decode token through its ``decode_swa_indices`` row (the
  first ``decode_swa_lens``), a prefill token through its request's gathered range: the last
  ``prefill_gather_lens`` positions before ``prefill_seq_lens``, clipped to the window, read
  through the SWA block table;
* col 1, C128A: the sum of ``c128a_cache`` over the token's complete compressed entries -- a
  decode token through its ``c128a_decode_indices`` row, a prefill token through its
  ``c128a_prefill_indices`` row of local indices, mapped to slots through the block table
  (0 without C128A layers);
* col 2, indexer: the sum of ``index_cache`` over the last ``min(n, 32)`` compressed keys of
  the ``n`` the token sees -- a decode token through its row of the decode lengths and block
  table (native or flattened), a prefill token through its key range ``[ks, ke)`` in its
  chunk's gathered K, the request's keys starting at its chunk's ``cu_seq_lens`` entry.

Each checksum is a function of the token alone when the metadata is right, whichever build
made it (a decode graph, a mixed graph, the reference's eager build with its own layouts and
splits), so comparing the rows of a replay and an eager run compares all metadata through a
real consumer. Triton on CUDA (graph-safe: no allocation, no host read), torch elsewhere
(eager only). An eager build plans the indexer's prefill chunks on the host
(``prefill.chunks``); the consumer then lays them out as a mixed build's device plan in
buffers it owns (a few eager copies) and reads both alike.
"""

from __future__ import annotations

import torch

from staticattn.arena import ArenaConfig
from staticattn.builders.batch import Batch
from staticattn.builders.indexer.prefill import max_chunks
from staticattn.consumers.checksums import GatherArgs, gather_checksums
from staticattn.kernels.backend import resolve_backend
from staticattn.kernels.indexer_plan import CHUNK_FIELDS

__all__ = ["GatherConsumer"]


class GatherConsumer:
    """Callable step ``(batch, metadata) -> (num_tokens, 3) int64`` over owned buffers.

    Parameters
    ----------
    config : ArenaConfig
    num_kv_blocks : int
        Blocks of each fake cache; block ids of the batch must be below it.
    seed : int
        Fills the caches with random values.
    """

    def __init__(self, config: ArenaConfig, num_kv_blocks: int = 4096, seed: int = 0) -> None:
        self.config = config
        dev = config.torch_device
        gen = torch.Generator(device="cpu").manual_seed(seed)

        def cache(entries: int) -> torch.Tensor:
            return torch.randint(0, 1 << 20, (entries,), generator=gen, dtype=torch.int32).to(dev)

        self.swa_cache = cache(num_kv_blocks * config.swa_block_size)
        self.c128a_cache = cache(num_kv_blocks * _dense_entries_per_block(config))
        self.index_cache = cache(num_kv_blocks * config.storage_block_size)
        t, r = config.max_num_batched_tokens, config.max_num_seqs
        self.out = torch.zeros(t, 3, dtype=torch.int64, device=dev)
        # A host-planned prefill laid out as a device plan (eager builds only), with as many
        # rows as the device plan can need (query sub-chunks included).
        self.chunk_table = torch.zeros(max_chunks(config, r, t), CHUNK_FIELDS,
                                       dtype=torch.int32, device=dev)
        self.cu_seq_lens = torch.zeros(2 * r, dtype=torch.int32, device=dev)
        self.ks = torch.zeros(t, dtype=torch.int32, device=dev)
        self.ke = torch.zeros(t, dtype=torch.int32, device=dev)
        self.backend = resolve_backend(config.kernel_backend, dev)

    def __call__(self, batch: Batch, metadata: dict) -> torch.Tensor:
        num_tokens = batch.num_actual_tokens
        out = self.out[:num_tokens]
        gather_checksums(self.backend, self._args(batch, metadata), out)
        return out

    def _args(self, batch: Batch, metadata: dict) -> GatherArgs:
        swa, idx = metadata.get("swa"), metadata.get("indexer")
        cfg = self.config
        args = GatherArgs(
            num_tokens=batch.num_actual_tokens, token_to_req=batch.token_to_req,
            positions=batch.positions, query_start_loc=batch.query_start_loc,
            block_table=batch.block_table, swa_block_table=batch.swa_block_table,
            step_counts=batch.step_counts, caches=(self.swa_cache, self.c128a_cache,
                                                   self.index_cache),
            window=cfg.sliding_window or 1, swa_block_size=cfg.swa_block_size,
            c128a_entries=_dense_entries_per_block(cfg),
            storage_block_size=cfg.storage_block_size,
        )
        if swa is not None:
            args.set_swa(swa)
        if idx is not None:
            args.set_indexer(idx)
            chunks = idx.prefill.chunks if idx.prefill is not None else []
            if idx.prefill is not None and idx.prefill.plan is not None:
                plan = idx.prefill.plan
                args.set_prefill_plan(plan.chunk_bounds, plan.num_chunks, plan.cu_seq_lens,
                                      plan.cu_seqlen_ks, plan.cu_seqlen_ke)
            elif chunks:
                args.set_prefill_plan(*self._lay_out(chunks, batch.num_actual_tokens))
        return args

    def _lay_out(self, chunks, num_tokens: int):
        """Host-planned chunks as a device plan in owned buffers (eager only)."""
        self.cu_seq_lens.zero_()
        self.ks[:num_tokens].zero_()
        self.ke[:num_tokens].zero_()
        rows = []
        for c in chunks:
            start = c.req_start
            self.cu_seq_lens[2 * start : 2 * start + c.num_reqs + 1].copy_(c.cu_seq_lens)
            self.ks[c.token_start : c.token_end].copy_(c.cu_seqlen_ks)
            self.ke[c.token_start : c.token_end].copy_(c.cu_seqlen_ke)
            rows.append([start, start + c.num_reqs, c.token_start, c.token_end,
                         c.total_seq_lens, int(c.skip_kv_gather), 0, 0])
        table = self.chunk_table[: len(rows)]
        table.copy_(torch.tensor(rows, dtype=torch.int32))
        count = torch.tensor([len(rows)], dtype=torch.int32, device=table.device)
        return table, count, self.cu_seq_lens, self.ks, self.ke


def _dense_entries_per_block(config: ArenaConfig) -> int:
    """Entries per main-group block of the type that reads every compressed entry (C128A);
    1 without one (the cache then holds one unread entry per block)."""
    dense = config.dense_layer_type
    return dense.entries_per_block(config.block_size) if dense is not None else 1
