"""The indexer's prefill part (spec §4.6-§4.7): chunks planned on the host for eager builds,
or on the device for builds of any composition, into the same arena views.

:class:`IndexerPrefill` owns the prefill views of the ``indexer.*`` buffers;
:class:`~staticattn.builders.indexer.builder.IndexerMetadataBuilder` hands it the batch.
"""

from __future__ import annotations

import numpy as np
import torch

from staticattn.arena import Arena, ArenaConfig, BufferDecl
from staticattn.builders.attention_utils.chunking import split_indexer_prefill_chunks
from staticattn.builders.batch import Batch
from staticattn.builders.indexer.index_type import IndexType
from staticattn.builders.indexer.metadata import (
    IndexerPrefillChunkMetadata,
    IndexerPrefillMetadata,
    IndexerPrefillPlan,
)
from staticattn.kernels.dcp.ownership import dcp_local_count
from staticattn.kernels.indexer.prefill_plan import (
    CHUNK_FIELDS,
    max_prefill_chunks,
    plan_prefill_chunks,
)
from staticattn.kernels.indexer.prefill_ranges import indexer_prefill_chunk

__all__ = ["IndexerPrefill", "max_chunks"]


def max_chunks(config: ArenaConfig, num_reqs: int, num_tokens: int,
               compress_ratio: int | None = None) -> int:
    """Rows of the device chunk plan for ``num_reqs`` requests / ``num_tokens`` tokens of an
    index K of ratio ``compress_ratio`` (default: the config's one index type's)."""
    ratio = config.index_compress_ratio if compress_ratio is None else compress_ratio
    return max_prefill_chunks(num_reqs, num_tokens, config.max_model_len // ratio,
                              config.max_logits_bytes // 4)


class IndexerPrefill:
    """The prefill views and their two builds.

    Buffers (``<name>.*``, device, ``name`` the builder's: ``indexer`` or
    ``indexer.<type>``; ``T = max_num_batched_tokens``, ``R = max_num_seqs``):
    ``cu_seqlen_ks``, ``cu_seqlen_ke`` int32 ``(T,)`` (key ranges by global token);
    ``cu_seq_lens`` int32 ``(2R,)`` (requests ``[s, e)`` own ``[2s, s + e + 1)``, disjoint
    for disjoint ranges, so every chunk of a step keeps its own view); ``prefill_chunks``
    int32 ``(C, 8)``, ``num_prefill_chunks`` int32 ``(1,)``, ``req_key_start`` int32
    ``(R,)`` (the device plan; ``C`` from :func:`max_chunks`); under decode context
    parallelism ``local_cu_seq_lens`` int32 ``(2R,)``, laid out as ``cu_seq_lens``, and
    ``local_req_key_start`` int32 ``(R,)``, as ``req_key_start``: the rank's local keys.
    """

    def __init__(self, name: str = "indexer") -> None:
        self.name = name
        self.config: ArenaConfig | None = None

    def buffers(self, config: ArenaConfig, compress_ratio: int) -> list[BufferDecl]:
        """The prefill part's declarations for an index K of ratio ``compress_ratio``:
        per-token key ranges int32 ``(T,)``, chunk key prefix sums, the device chunk plan
        and its per-request key starts."""
        tokens, reqs, name = config.max_num_batched_tokens, config.max_num_seqs, self.name
        return [
            BufferDecl(f"{name}.cu_seqlen_ks", (tokens,), torch.int32),
            BufferDecl(f"{name}.cu_seqlen_ke", (tokens,), torch.int32),
            BufferDecl(f"{name}.cu_seq_lens", (2 * reqs,), torch.int32),
            BufferDecl(f"{name}.prefill_chunks",
                       (max_chunks(config, reqs, tokens, compress_ratio), CHUNK_FIELDS),
                       torch.int32),
            BufferDecl(f"{name}.num_prefill_chunks", (1,), torch.int32),
            BufferDecl(f"{name}.req_key_start", (reqs,), torch.int32),
        ] + ([BufferDecl(f"{name}.local_cu_seq_lens", (2 * reqs,), torch.int32),
              BufferDecl(f"{name}.local_req_key_start", (reqs,), torch.int32)]
             if config.dcp_world_size > 1 else [])

    def bind(self, arena: Arena, backend: str, index: IndexType) -> None:
        """Take the prefill views of an allocated arena for the index K ``index``; kernels
        run on ``backend``."""
        self.config = cfg = arena.config
        self.backend = backend
        self.index = index
        self.compress_ratio = index.compress_ratio
        name = self.name
        self.cu_seqlen_ks = arena[f"{name}.cu_seqlen_ks"]
        self.cu_seqlen_ke = arena[f"{name}.cu_seqlen_ke"]
        self.cu_seq_lens = arena[f"{name}.cu_seq_lens"]
        self.prefill_chunks = arena[f"{name}.prefill_chunks"]
        self.num_prefill_chunks = arena[f"{name}.num_prefill_chunks"]
        self.req_key_start = arena[f"{name}.req_key_start"]
        self.dcp = index.dcp_shard(cfg)
        sharded = self.dcp is not None
        self.local_cu_seq_lens = arena[f"{name}.local_cu_seq_lens"] if sharded else None
        self.local_req_key_start = arena[f"{name}.local_req_key_start"] if sharded else None

    # ------------------------------------------------------------------ host plan
    def host_keys(self, batch: Batch) -> np.ndarray:
        """Host (upper-bound) compressed key counts of every request: int64 ``(num_reqs,)``."""
        lens = batch.host_arrays()[2].astype(np.int64)
        return np.maximum(lens, 0) // self.compress_ratio

    def build_host_planned(self, batch: Batch, qsl: np.ndarray, num_decodes: int,
                           num_prefills: int) -> IndexerPrefillMetadata:
        """The chunks of the prefill requests, planned from the host lengths (eager);
        ``qsl``: the host query starts, int32 ``(num_reqs + 1,)``."""
        cfg = self.config
        keys = self.host_keys(batch)
        prefills = slice(num_decodes, num_decodes + num_prefills)
        plan = split_indexer_prefill_chunks(
            keys[prefills], np.diff(qsl[num_decodes : num_decodes + num_prefills + 1]),
            cfg.max_prefill_workspace, cfg.max_logits_bytes, request_offset=num_decodes,
        )
        chunks, written = [], None
        for reqs, queries in plan:
            total = int(keys[reqs].sum())
            if total == 0:
                continue
            if reqs != written:  # query sub-chunks of one request range share one launch
                self.write_chunk(batch, qsl, reqs.start, reqs.stop)
                written = reqs
            chunks.append(self.chunk_views(batch, qsl, reqs.start, reqs.stop, queries, total))
        return IndexerPrefillMetadata(chunks)

    def build_chunk(self, batch: Batch, qsl: np.ndarray, start: int, end: int,
                    query_slice: slice | None) -> IndexerPrefillChunkMetadata | None:
        """Write the chunk over requests ``[start, end)`` and return its views (queries
        ``query_slice`` of them), or None when it has no compressed key (``qsl``: the host
        query starts, int ``(num_reqs + 1,)``)."""
        total = int(self.host_keys(batch)[start:end].sum())
        if total == 0:
            return None
        self.write_chunk(batch, qsl, start, end)
        return self.chunk_views(batch, qsl, start, end, query_slice, total)

    def write_chunk(self, batch: Batch, qsl: np.ndarray, start: int, end: int) -> None:
        """Launch the chunk kernel for requests ``[start, end)``: their key prefix sums and
        every token's key range (``qsl``: the host query starts, int ``(num_reqs + 1,)``)."""
        indexer_prefill_chunk(
            self.backend, batch.query_start_loc, batch.seq_lens,
            self._cu_seq_lens_region(start, end), self.cu_seqlen_ks,
            self.cu_seqlen_ke, start=start, end=end, token_start=int(qsl[start]),
            token_end=int(qsl[end]), compress_ratio=self.compress_ratio, dcp=self.dcp,
            local_cu_seq_lens=self._cu_seq_lens_region(start, end, local=True),
        )

    def _cu_seq_lens_region(self, start: int, end: int, local: bool = False) -> torch.Tensor:
        buffer = self.local_cu_seq_lens if local and self.dcp is not None else self.cu_seq_lens
        return buffer[2 * start : start + end + 1]

    def _local_totals(self, batch: Batch, start: int, end: int, total: int) -> tuple[int, int]:
        """``(this rank's, the largest rank's)`` host key counts of requests ``[start, end)``."""
        if self.dcp is None:
            return total, total
        keys = torch.from_numpy(self.host_keys(batch)[start:end])
        world, rank, interleave = self.dcp
        per_rank = [int(dcp_local_count(keys, world, r, interleave).sum()) for r in range(world)]
        return per_rank[rank], max(per_rank)

    def chunk_views(
        self, batch: Batch, qsl: np.ndarray, start: int, end: int, query_slice: slice | None,
        total: int,
    ) -> IndexerPrefillChunkMetadata:
        """The chunk's metadata as views of what :meth:`write_chunk` wrote: requests
        ``[start, end)``, queries ``query_slice`` of them (all when None), ``total``
        compressed keys to gather; ``qsl``: the host query starts, int32
        ``(num_reqs + 1,)``."""
        first = int(qsl[start])
        lo, hi = ((0, int(qsl[end]) - first) if query_slice is None
                  else (query_slice.start, query_slice.stop))
        local_total, max_local_total = self._local_totals(batch, start, end, total)
        return IndexerPrefillChunkMetadata(
            block_table=self.index.table(batch)[start:end],
            cu_seqlen_ks=self.cu_seqlen_ks[first + lo : first + hi],
            cu_seqlen_ke=self.cu_seqlen_ke[first + lo : first + hi],
            cu_seq_lens=self._cu_seq_lens_region(start, end),
            total_seq_lens=total, token_start=first + lo, token_end=first + hi,
            num_reqs=end - start, skip_kv_gather=lo > 0, req_start=start,
            local_cu_seq_lens=self._cu_seq_lens_region(start, end, local=True),
            local_total_seq_lens=local_total, max_local_total_seq_lens=max_local_total,
        )

    # ---------------------------------------------------------------- device plan
    def build_device_planned(self, batch: Batch) -> IndexerPrefillMetadata:
        """The same chunks planned on the device, for a step of any composition within
        ``batch``'s static extents (graph-safe; one launch); under decode context
        parallelism with the rank's local row bounds."""
        cfg = self.config
        sharded = self.dcp is not None
        r, t = batch.num_reqs, batch.num_actual_tokens
        plan = IndexerPrefillPlan(
            chunk_bounds=self.prefill_chunks[: max_chunks(cfg, r, t, self.compress_ratio)],
            num_chunks=self.num_prefill_chunks, cu_seq_lens=self.cu_seq_lens[: 2 * r],
            req_key_start=self.req_key_start[:r], cu_seqlen_ks=self.cu_seqlen_ks[:t],
            cu_seqlen_ke=self.cu_seqlen_ke[:t], block_table=self.index.table(batch),
            local_cu_seq_lens=self.local_cu_seq_lens[: 2 * r] if sharded else None,
            local_req_key_start=self.local_req_key_start[:r] if sharded else None,
        )
        plan_prefill_chunks(
            self.backend, batch.query_start_loc, batch.seq_lens, batch.positions,
            batch.token_to_req, batch.step_counts, plan.chunk_bounds, plan.num_chunks,
            plan.cu_seq_lens, plan.req_key_start, plan.cu_seqlen_ks, plan.cu_seqlen_ke,
            num_reqs=r, num_tokens=t, compress_ratio=self.compress_ratio,
            workspace=cfg.max_prefill_workspace, logits_budget=cfg.max_logits_bytes // 4,
            dcp=self.dcp, local_cu_seq_lens=plan.local_cu_seq_lens,
            local_req_key_start=plan.local_req_key_start,
        )
        return IndexerPrefillMetadata([], plan)
