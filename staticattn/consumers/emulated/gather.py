"""A built-in consumer step: reads the metadata the way attention kernels do, for every token.

For every real token ``t`` (request ``b``, position ``p``) it gathers from three fake caches it
owns and writes one row of checksums into its own output ``(max_num_batched_tokens, 3)``
int64 (padded tokens: zeros):

* col 0, SWA: the sum of ``swa_cache`` over the slots of the token's window, positions
  ``[max(p - W + 1, 0), p]`` -- a decode token through its ``decode_swa_indices`` row (the
  first ``decode_swa_lens``), a prefill token through its request's gathered range: the last
  ``prefill_gather_lens`` positions before ``prefill_seq_lens``, clipped to the window, read
  through the SWA block table;
* col 1, the dense type (C128A in V4): the sum of ``dense_cache`` over the token's complete
  compressed entries -- a decode token through its ``dense_decode_indices`` row, a prefill
  token through its row of local indices in the metadata's ``dense_prefill`` chunks, mapped
  to slots through the block table, one chunk of prefill tokens at a time (written, then
  read, inside the step: :mod:`staticattn.consumers.emulated.dense_prefill_checksums`); 0
  without dense layers;
* col 2, indexer: the sum of ``index_cache`` over the last ``min(n, 32)`` compressed keys of
  the ``n`` the token sees -- a decode token through its row of the decode lengths and block
  table (native or flattened), a prefill token through its key range ``[ks, ke)`` in its
  chunk's gathered K, the request's keys starting at its chunk's ``cu_seq_lens`` entry.

DeepSeek V4.1 (two index types, compressed caches of their own, :meth:`GatherConsumer.columns`):
an indexer column per index type (``indexer.c1a``, ``indexer.c2a``: its keys through its
``index_k`` group's table), and per kv-source type two columns of the compressed builder's
outputs (:mod:`staticattn.consumers.emulated.compressed_checksums`): the entries the token may read,
and the entry and compressor-ring row it writes. The dense type is absent there (column 1 is 0).

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
from staticattn.builders.compressed.builder import kv_source_types, ring_capacity
from staticattn.builders.indexer.index_type import indexer_name
from staticattn.builders.indexer.prefill import max_chunks
from staticattn.consumers.emulated.compressed_checksums import CompressedArgs, compressed_checksums
from staticattn.consumers.emulated.dense_prefill_checksums import dense_prefill_checksums
from staticattn.consumers.emulated.gather_checksums import GatherArgs, gather_checksums
from staticattn.kernels.indexer.prefill_plan import CHUNK_FIELDS
from staticattn.kernels.runtime.backend import resolve_backend
from staticattn.model import Addressing, Cache, LayerType

__all__ = ["GatherConsumer"]


class GatherConsumer:
    """Callable step ``(batch, metadata) -> (num_tokens, columns)`` int64 over owned buffers.

    Parameters
    ----------
    config : ArenaConfig
    num_kv_blocks : int
        Blocks of each fake cache; block ids of the batch (every table's) must be below it.
    seed : int
        Fills the caches with random values.
    backend : str, optional
        The consumer's own kernels, "torch" or "triton"; None: the config's
        ``kernel_backend``. A test of the builders' interpreted Triton kernels on CPU reads
        them through the torch kernels, which give the same sums at a fraction of the
        interpreter's time.

    Attributes
    ----------
    columns : list of str
        What each output column sums: ``"swa"``, ``"dense"``, one per index type (its
        indexer builder's name: ``"indexer"``, or ``"indexer.c1a"`` ...), then per
        kv-source type with cache groups of its own ``"<type>.read"``, ``"<type>.write"``
        (DeepSeek V3.2 and V4: the first three only).
    caches : dict of str to int32 device tensor
        The fake caches by name: ``"swa"``, ``"dense"``, each index type's by its indexer
        column name, each own-group kv-source type's ``"<type>.compressed_kv"`` and (with a
        ring) ``"<type>.compressor_state"``; flat, indexed by slot.
    """

    def __init__(self, config: ArenaConfig, num_kv_blocks: int = 4096, seed: int = 0,
                 backend: str | None = None) -> None:
        self.config = config
        dev = config.torch_device
        gen = torch.Generator(device="cpu").manual_seed(seed)

        def cache(entries: int) -> torch.Tensor:
            return torch.randint(0, 1 << 20, (entries,), generator=gen, dtype=torch.int32).to(dev)

        self._index = [(indexer_name(config, t), t) for t in config.index_layer_types]
        self._kv = [t for t in kv_source_types(config) if t.addressing is Addressing.OWN_GROUPS]
        self.columns = ["swa", "dense", *(name for name, _ in self._index),
                        *(f"{t.name}.{x}" for t in self._kv for x in ("read", "write"))]
        self.caches = {"swa": cache(num_kv_blocks * config.swa_block_size),
                       "dense": cache(num_kv_blocks * _dense_entries_per_block(config))}
        for name, t in self._index:
            self.caches[name] = cache(num_kv_blocks * t.entries_per_block(config.block_size))
        for t in self._kv:
            self.caches[t.group(Cache.COMPRESSED_KV)] = cache(
                num_kv_blocks * t.entries_per_block(config.block_size))
            if Cache.COMPRESSOR_STATE in t.owns:
                self.caches[t.group(Cache.COMPRESSOR_STATE)] = cache(
                    num_kv_blocks * ring_capacity(config.num_speculative_tokens))
        t, r = config.max_num_batched_tokens, config.max_num_seqs
        self.out = torch.zeros(t, len(self.columns), dtype=torch.int64, device=dev)
        # A host-planned prefill laid out as a device plan (eager builds only), with as many
        # rows as the device plan can need (query sub-chunks included).
        rows = max((max_chunks(config, r, t, x.compress_ratio) for _, x in self._index),
                   default=1)
        self.chunk_table = torch.zeros(rows, CHUNK_FIELDS, dtype=torch.int32, device=dev)
        self.cu_seq_lens = torch.zeros(2 * r, dtype=torch.int32, device=dev)
        self.ks = torch.zeros(t, dtype=torch.int32, device=dev)
        self.ke = torch.zeros(t, dtype=torch.int32, device=dev)
        self.backend = resolve_backend(config.kernel_backend if backend is None else backend,
                                       dev)

    def __call__(self, batch: Batch, metadata: dict) -> torch.Tensor:
        num_tokens = batch.num_actual_tokens
        out = self.out[:num_tokens]
        if len(self.columns) > 3:
            # V4.1's launches leave the dense column unwritten; V3.2 and V4's one launch
            # writes all three columns, so their graphs keep one kernel less.
            out.zero_()
        # One launch per index type (one without an indexer): the first also sums the window
        # and dense columns, and then the dense prefill rows, chunk by chunk.
        for column, (name, layer_type) in enumerate(self._index or [(None, None)], start=2):
            args = self._args(batch, metadata, name, layer_type)
            args.index_column, args.window_columns = column, column == 2
            gather_checksums(self.backend, args, out)
            dense_prefill_checksums(self.backend, args, out)
        compressed = metadata.get("compressed")
        first = 2 + len(self._index)
        for j, t in enumerate(self._kv if compressed is not None else ()):
            compressed_checksums(self.backend, self._compressed_args(batch, compressed, t),
                                 out[:, first + 2 * j:])
        return out

    def _compressed_args(self, batch: Batch, md, t: LayerType) -> CompressedArgs:
        kv = md.types[t.name]
        return CompressedArgs(
            num_tokens=batch.num_actual_tokens, token_to_req=batch.token_to_req,
            step_counts=batch.step_counts, block_table=kv.block_table,
            entries_per_block=kv.entries_per_block, entry_counts=kv.entry_counts,
            slot_mapping=kv.slot_mapping, ring_slot_mapping=kv.ring_slot_mapping,
            kv_cache=self.caches[t.group(Cache.COMPRESSED_KV)],
            ring_cache=self.caches.get(t.group(Cache.COMPRESSOR_STATE)))

    def _args(self, batch: Batch, metadata: dict, name: str | None,
              layer_type: LayerType | None) -> GatherArgs:
        swa, idx = metadata.get("swa"), metadata.get(name) if name else None
        cfg = self.config
        # The index type's K table (V4.1: its group's; otherwise the main one, which also
        # addresses the dense type: no config has both).
        table = (batch.table_of(layer_type, Cache.INDEX_K) if layer_type is not None
                 else batch.block_table)
        index_cache = self.caches[name] if name else self.caches["dense"]
        args = GatherArgs(
            num_tokens=batch.num_actual_tokens, token_to_req=batch.token_to_req,
            positions=batch.positions, query_start_loc=batch.query_start_loc,
            block_table=table, swa_block_table=batch.swa_block_table,
            step_counts=batch.step_counts, caches=(self.caches["swa"], self.caches["dense"],
                                                   index_cache),
            window=cfg.sliding_window or 1, swa_block_size=cfg.swa_block_size,
            dense_entries=_dense_entries_per_block(cfg),
            storage_block_size=(layer_type.entries_per_block(cfg.block_size)
                                if layer_type is not None else cfg.block_size),
        )
        if swa is not None:
            args.set_swa(swa)
        if idx is not None:
            args.set_indexer(idx)
            chunks = idx.prefill.chunks if idx.prefill is not None else []
            if idx.prefill is not None and idx.prefill.plan is not None:
                plan = idx.prefill.plan
                args.plan = (plan.chunk_bounds, plan.num_chunks, plan.cu_seq_lens,
                             plan.cu_seqlen_ks, plan.cu_seqlen_ke)
            elif chunks:
                args.plan = self._lay_out(chunks, batch.num_actual_tokens)
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
