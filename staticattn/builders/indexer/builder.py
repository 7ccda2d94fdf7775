"""The sparse-attention indexer's metadata builder (DeepSeek V3.2; V4 with ``R = 4``; V4.1's
``c1a`` and ``c2a``, one builder each), graph-safe, writing only into arena views (spec §4;
``docs/spec/deepseek-v41.md`` §5.2, §6).

Per step it produces (:mod:`staticattn.builders.indexer.metadata`):

* the slot mapping of the indexer's K cache -- compressed (spec §4.5) when ``R > 1``;
* for the decodes: per-token visible lengths, query lengths, the block table (expanded per
  token when flattening) and the paged-MQA-logits schedule;
* for the prefills: chunks bounded by the gather workspace and the logits budget, each with its
  key prefix sums and per-token key ranges.

Three entry points (the builder contract, :mod:`staticattn.builders.contract`):

* :meth:`IndexerMetadataBuilder.build` -- any batch, eager; plans from the host lengths the
  batch carries (like the reference engine) and never reads the device;
* :meth:`IndexerMetadataBuilder.build_decode` -- a uniform decode batch of a static size
  (:meth:`Batch.for_decode_capture`), safe inside a CUDA graph: the decode layout comes from
  the config alone, every extent is static, and it launches one decode kernel (which also
  writes the compressed slot mapping when ``R > 1``) and one schedule kernel;
* :meth:`IndexerMetadataBuilder.build_mixed` -- a step of any composition within a token
  bucket (:meth:`Batch.for_mixed_capture`), safe inside a CUDA graph: the split comes from
  the device (``step_counts``), MTP decodes are flattened (their per-request lengths are
  data), the prefill chunks are planned on the device; three kernels (decode + slots,
  schedule, chunk plan).

Deviations from the reference, each chosen so a captured graph never reads a stale or
out-of-range value: lengths are clamped at 0 (the reference leaves padded native MTP rows at
``[1 - n, ..., 0]``); padded flatten rows of the expanded block table are zeroed whole (the
reference zeroes column 0); the native MTP lengths are a contiguous ``(D, max_decode_len)``
view of a flat buffer (the reference's 2-D buffer is non-contiguous when
``max_decode_len < next_n``, spec §11 item 2); plain decode copies the lengths into the
builder's buffer for ``R = 1`` too; prefill metadata lives in arena views, and the ROCm-only
``token_to_seq`` is not built.
"""

from __future__ import annotations

import functools

import torch

from staticattn.arena import Arena, ArenaConfig, BufferDecl
from staticattn.builders.attention_utils.split import split_decodes_and_prefills
from staticattn.builders.batch import Batch
from staticattn.builders.contract import bound_config, claim_arena
from staticattn.builders.indexer.decode_layout import (
    DecodeLayout,
    DecodeLens,
    eager_layout,
    flattens,
    need_token_views,
)
from staticattn.builders.indexer.index_type import index_type
from staticattn.builders.indexer.metadata import (
    IndexerDecodeMetadata,
    IndexerMetadata,
    IndexerPrefillChunkMetadata,
)
from staticattn.builders.indexer.prefill import IndexerPrefill
from staticattn.errors import CapacityError, InvalidBatchError
from staticattn.kernels.indexer.decode_tensors import ExpandedTable, indexer_decode_tensors
from staticattn.kernels.indexer.index_slots import compressed_slot_mapping
from staticattn.kernels.indexer.indexer_kernel import table_tiles_shape
from staticattn.kernels.indexer.mqa_schedule import paged_mqa_schedule
from staticattn.kernels.runtime.backend import resolve_backend
from staticattn.staging import PAD_SLOT_ID

__all__ = ["IndexerMetadataBuilder", "flattens"]


class IndexerMetadataBuilder:
    """Builds :class:`IndexerMetadata` into the arena.

    Buffers (``<name>.*``, device, from :meth:`buffers`), with ``Tdec = max_decode_tokens``
    (``max_num_seqs * next_n``, at most ``max_num_batched_tokens``) and
    ``T = max_num_batched_tokens``:

    - ``decode_lens`` int32 ``(Tdec,)``: query lengths (native) or ones (flatten);
    - ``decode_seq_lens`` int32 ``(Tdec,)``: flat, viewed ``(rows, width)`` contiguous;
    - ``schedule_metadata`` int32 ``(num_sms + 1, 2)``: the paged-MQA-logits schedule;
    - ``cu_seqlen_ks``, ``cu_seqlen_ke`` int32 ``(T,)``: prefill key ranges, by global token;
    - ``cu_seq_lens`` int32 ``(2 * max_num_seqs,)``: prefill chunks' key prefix sums;
    - ``expanded_block_table`` int32 ``(Tdec, C)`` (``C`` the index-K table's columns) and
      its tiles' flags ``expanded_table_tiles`` int32 ``table_tiles_shape(Tdec, C)``: with
      MTP (``next_n > 1``), which the mixed build always flattens;
    - ``compressed_slot_mapping`` int64 ``(T,)``, initially -1: when ``R > 1``, for a type
      with its own index-K table, or under decode context parallelism (the rank's own
      slots, see below);
    - ``decode_global_seq_lens`` int32 ``(Tdec,)``: under decode context parallelism only;
    - ``prefill_chunks`` int32 ``(C, 8)``, ``num_prefill_chunks`` int32 ``(1,)``,
      ``req_key_start`` int32 ``(max_num_seqs,)``: the device chunk plan of the mixed build
      (``C`` from :func:`~staticattn.builders.indexer.prefill.max_chunks`).

    The prefill chunk over requests ``[s, e)`` owns ``cu_seq_lens[2s : s + e + 1]``: disjoint
    for disjoint ranges, so every chunk of a step keeps its own view.

    Decode context parallelism (``config.dcp_world_size = W > 1``, this arena's
    ``dcp_rank``, interleave ``I``): the batch's lengths, positions and query starts are the
    global ones (every rank stages the same), the block table is the rank's local one. The
    decode ``seq_lens`` become this rank's share of each token's global visible length,
    computed after the per-token expansion, and ``decode.global_seq_lens`` carries the
    global ones; the slot mapping holds only the entries this rank stores (compressed when
    ``R > 1``; for ``R = 1`` the uncompressed one, which the builder then computes itself);
    the schedule is planned from the local lengths; prefill chunks are planned from the
    global lengths (the same plan on every rank) and carry the rank's local row bounds
    (:class:`IndexerPrefillChunkMetadata`). The rank is a static int of the arena.

    One builder serves one index-owning layer type (:mod:`.index_type`): its ratio ``R``,
    its entries per block ``S = block_size // R`` and the block table its index K is
    addressed through come from the type's row. Under DeepSeek V4.1 (two types) each type
    has its own builder, named ``"indexer.<type>"`` (metadata key and buffer prefix), whose
    index K lives in the ``<type>.index_k`` cache group: its slot mapping is computed from
    that group's table (``R = 1``: the token's own entry; ``R = 2``: odd positions, entry
    ``p // 2``), and a token whose own staged slot is -1 writes nothing; under DCP that
    table holds the rank's local blocks and the type's entries are dealt at ``I // R``.

    Parameters
    ----------
    layer_type : str or None
        The index-owning type served ("c1a"); None: the config's only one, under the name
        ``"indexer"`` (DeepSeek V3.2 and V4).
    legacy_schedule : bool
        Split the paged-MQA-logits work with DeepGEMM v2.1-v2.3's remainder rule (the
        reference engine's pinned DeepGEMM) instead of v2.4+'s. Either covers all work.

    Examples
    --------
    >>> from staticattn.builders import make_arena
    >>> cfg = ArenaConfig(device="cpu", max_model_len=2048, max_num_seqs=4,
    ...                   max_num_batched_tokens=64, num_speculative_tokens=1)
    >>> builder = IndexerMetadataBuilder()
    >>> arena, inputs = make_arena(cfg, [builder])
    >>> import numpy as np
    >>> counts = inputs.stage(np.array([2, 2]), np.array([10, 7]), np.arange(4),
    ...                       num_reqs_padded=3, num_tokens_padded=6)
    >>> inputs.copy_to_device(3, 6)
    >>> meta = builder.build_decode(Batch.for_decode_capture(inputs, 3))
    >>> meta.decode.seq_lens.tolist()
    [[9, 10], [6, 7], [0, 0]]
    """

    arena: Arena | None = None  # the arena bound to, for life
    def __init__(self, layer_type: str | None = None, *, legacy_schedule: bool = False) -> None:
        self.layer_type = layer_type
        #: Metadata key and buffer prefix: "indexer", or "indexer.<type>" for a named type.
        self.name = "indexer" if layer_type is None else f"indexer.{layer_type}"
        self.legacy_schedule = legacy_schedule
        self.config: ArenaConfig | None = None
        self.prefill = IndexerPrefill(self.name)

    # ------------------------------------------------------------------ contract
    def buffers(self, config: ArenaConfig) -> list[BufferDecl]:
        """The ``<name>.*`` declarations for ``config`` (listed in the class docstring; the
        compressed slot mapping also for a type with its own index-K table)."""
        kind = index_type(config, self.layer_type)
        rows, tokens, name = config.max_decode_tokens, config.max_num_batched_tokens, self.name
        decls = [
            BufferDecl(f"{name}.decode_lens", (rows,), torch.int32),
            BufferDecl(f"{name}.decode_seq_lens", (rows,), torch.int32),
            BufferDecl(f"{name}.schedule_metadata", (config.num_sms + 1, 2), torch.int32),
            *self.prefill.buffers(config, kind.compress_ratio),
        ]
        if config.next_n > 1:
            columns = kind.table_columns
            decls += [BufferDecl(f"{name}.expanded_block_table", (rows, columns), torch.int32),
                      BufferDecl(f"{name}.expanded_table_tiles", table_tiles_shape(rows, columns),
                                 torch.int32)]
        if kind.computes_slots(config):
            decls.append(BufferDecl(f"{name}.compressed_slot_mapping", (tokens,), torch.int64,
                                    fill=PAD_SLOT_ID))
        if config.dcp_world_size > 1:
            decls.append(BufferDecl(f"{name}.decode_global_seq_lens", (rows,), torch.int32))
        return decls

    def bind(self, arena: Arena) -> None:
        """Take the ``indexer.*`` views of an allocated arena; views are cut and cached per
        binding from here on."""
        claim_arena(self, arena)
        cfg = arena.config
        kind = self.index = index_type(cfg, self.layer_type)
        self.config = cfg
        self.backend = resolve_backend(cfg.kernel_backend, arena.device)
        self.compress_ratio = kind.compress_ratio
        name = self.name
        self.decode_lens = arena[f"{name}.decode_lens"]
        self.decode_seq_lens = arena[f"{name}.decode_seq_lens"]
        self.schedule_metadata = arena[f"{name}.schedule_metadata"]
        flat = cfg.next_n > 1
        self.expanded = (ExpandedTable(arena[f"{name}.expanded_block_table"],
                                       arena[f"{name}.expanded_table_tiles"]) if flat else None)
        self.dcp = kind.dcp_shard(cfg)
        sharded = self.dcp is not None
        self.decode_global_seq_lens = arena[f"{name}.decode_global_seq_lens"] if sharded else None
        self.prefill.bind(arena, self.backend, kind)
        self.compressed_slot_mapping = (
            arena[f"{name}.compressed_slot_mapping"] if kind.computes_slots(cfg) else None
        )
        # Views cut once per extent and kept, per binding: a builder bound to another arena
        # must never hand out views of the previous one.
        self._decode_views = functools.lru_cache(maxsize=4096)(self._cut_decode_views)
        self._slot_views = functools.lru_cache(maxsize=4096)(self._cut_slot_views)

    def build(self, batch: Batch) -> IndexerMetadata:
        """Metadata for any batch (decodes first), eager.

        Plans from ``query_start_loc_cpu`` and ``seq_lens_cpu`` (host); raises before
        writing anything if a decode layout would not fit its buffers.
        """
        cfg = bound_config(self)
        need_token_views(batch)
        d, p, td, tp = split_decodes_and_prefills(
            batch, decode_threshold=cfg.next_n, require_uniform=not cfg.use_flattening
        )
        qsl, query_lens, _ = batch.host_arrays()
        layout = eager_layout(cfg, query_lens, d, td) if d else None
        if layout is not None:
            self._check_capacity(layout)
        num_tokens = batch.num_actual_tokens
        lens = DecodeLens.of(query_lens[:d]) if d else None
        if p == 0 and d and self.compressed_slot_mapping is not None:
            # Every request is a decode: the compressed slots ride in the decode launch.
            decode = self._build_decode_part(batch, d, layout, lens, self.compressed_slot_mapping,
                                             num_tokens)
            return self._metadata(batch, self._slot_views(num_tokens), (d, p, td, tp), None,
                                  decode)
        slots = self._write_slot_mapping(batch, num_tokens)
        prefill = self.prefill.build_host_planned(batch, qsl, d, p) if p else None
        decode = self._build_decode_part(batch, d, layout, lens) if d else None
        return self._metadata(batch, slots, (d, p, td, tp), prefill, decode)

    def _metadata(self, batch, slots, split, prefill, decode) -> IndexerMetadata:
        d, p, td, tp = split
        return IndexerMetadata(
            seq_lens=batch.seq_lens, max_seq_len=batch.max_seq_len, slot_mapping=slots,
            num_decodes=d, num_decode_tokens=td, num_prefills=p, num_prefill_tokens=tp,
            prefill=prefill, decode=decode, step_counts=batch.step_counts,
            positions=batch.positions, block_table=self.index.table(batch),
        )

    def build_decode(self, batch: Batch) -> IndexerMetadata:
        """Graph-safe metadata for a uniform decode batch of static size.

        ``batch`` is :meth:`Batch.for_decode_capture` of ``S`` requests x ``next_n`` tokens;
        at replay, trailing requests may be padding (query length 0, sequence length 0).
        Reads only arena views and static ints; output shapes depend on ``S`` and the
        config only. ``requires_padding`` is False: real rows are uniform and padded rows
        trailing, so the consumer's reshape stays right (spec §10.6).
        """
        cfg = bound_config(self)
        need_token_views(batch)
        s, n = batch.num_reqs, cfg.next_n
        if batch.num_actual_tokens != s * n:
            raise InvalidBatchError(
                f"build_decode needs a uniform decode batch of {s} x next_n={n} tokens, got "
                f"{batch.num_actual_tokens} tokens; build it with Batch.for_decode_capture"
            )
        flatten = flattens(cfg)
        layout = DecodeLayout(flatten, s * n if flatten else s, 1 if flatten else n, False)
        self._check_capacity(layout)
        # Every token is a decode token here, so the compressed slots ride along in the
        # decode kernel's launch.
        fused = self.compressed_slot_mapping
        decode = self._build_decode_part(batch, s, layout, DecodeLens(True, n),
                                         slots_out=fused)
        slots = batch.slot_mapping if fused is None else fused[: s * n]
        return self._metadata(batch, slots, (s, 0, s * n, 0), None, decode)

    def build_mixed(self, batch: Batch) -> IndexerMetadata:
        """Graph-safe metadata for a step of any composition within a token bucket.

        ``batch`` is :meth:`Batch.for_mixed_capture` of ``R`` requests and ``T`` tokens; the
        real step (up to those) and its decode/prefill split are only on the device
        (``batch.step_counts``, decode threshold ``next_n``). Layout, fixed by the config:

        * decodes, ``next_n = 1``: native, ``seq_lens (R, 1)``, the batch's block table;
          rows past the real decodes have length 0;
        * decodes, ``next_n > 1``: flattened into single-token rows whatever the config's
          flattening (each request's accepted draft length is data), ``Tdec = min(T,
          max_decode_tokens)`` rows, the expanded block table; rows past the real decode
          tokens have length 0 and an all-zero table row;
        * prefills: ``prefill.plan`` (:class:`IndexerPrefillPlan`), planned on the device with
          the same budgets as :meth:`build`; ``prefill.chunks`` is empty;
        * the compressed slot mapping of all ``T`` tokens (-1 past the real ones).

        The int fields of the result are the bucket's capacities; the exact split is
        ``step_counts``. Three launches: decode tensors + slots, schedule, chunk plan.
        """
        cfg = bound_config(self)
        need_token_views(batch)
        batch.require_step_counts()
        r, t = batch.num_reqs, batch.num_actual_tokens
        flatten = cfg.next_n > 1
        layout = DecodeLayout(flatten, min(t, cfg.max_decode_tokens) if flatten else r, 1,
                               False)
        self._check_capacity(layout)
        slots_out = self.compressed_slot_mapping
        # Per-step lengths are data here: not uniform as far as the host knows, bounded by
        # the decode threshold.
        decode = self._build_decode_part(batch, r, layout, DecodeLens(False, cfg.next_n),
                                         slots_out=slots_out, slot_tokens=t,
                                         step_counts=batch.step_counts)
        prefill = self.prefill.build_device_planned(batch)
        slots = batch.slot_mapping if slots_out is None else slots_out[:t]
        # The counts are the bucket's capacities; the exact split is batch.step_counts.
        return self._metadata(batch, slots, (r, r, layout.rows, t), prefill, decode)

    def build_prefill_chunk(
        self, batch: Batch, start: int, end: int, query_slice: slice | None = None
    ) -> IndexerPrefillChunkMetadata | None:
        """The metadata of one prefill chunk over requests ``[start, end)`` (spec §4.7), or
        None when the chunk has no compressed key. ``query_slice`` selects a query sub-chunk,
        relative to the chunk's first token."""
        bound_config(self)
        return self.prefill.build_chunk(batch, batch.host_arrays()[0], start, end, query_slice)

    # ------------------------------------------------------------------ decode
    def _check_capacity(self, layout: DecodeLayout) -> None:
        capacity = self.decode_seq_lens.shape[0]
        if layout.rows * layout.width > capacity:
            what = "decode tokens" if layout.flatten else "decode rows x max_decode_len"
            raise CapacityError(
                f"{what} = {layout.rows * layout.width} exceeds the indexer's decode capacity "
                f"max_decode_tokens={capacity} (max_num_seqs x next_n, at most "
                "max_num_batched_tokens)"
            )

    def _build_decode_part(
        self, batch: Batch, num_decodes: int, layout: DecodeLayout, lens: DecodeLens,
        slots_out: torch.Tensor | None = None, slot_tokens: int | None = None,
        step_counts: torch.Tensor | None = None,
    ) -> IndexerDecodeMetadata:
        rows, width = layout.rows, layout.width
        expanded = self.expanded if layout.flatten else None
        block_table = self.index.table(batch)
        indexer_decode_tensors(
            self.backend, batch.query_start_loc, batch.seq_lens, block_table,
            batch.positions, batch.token_to_req, self.decode_lens, self.decode_seq_lens,
            expanded, num_decodes=num_decodes, num_rows=rows, width=width,
            compress_ratio=self.compress_ratio, slot_mapping_out=slots_out,
            storage_block_size=self.index.storage_block_size, slot_tokens=slot_tokens,
            step_counts=step_counts, dcp=self.dcp, global_seq_lens=self.decode_global_seq_lens,
            gate=(self.index.slot_gate(batch, self.config.sliding_window or 0)
                  if slots_out is not None else None),
        )
        seq_lens, global_seq_lens, decode_lens, expanded_rows = self._decode_views(
            rows, width, layout.flatten)
        paged_mqa_schedule(self.backend, seq_lens, self.schedule_metadata,
                           legacy_remainder=self.legacy_schedule)
        whole = num_decodes == batch.num_reqs
        table = block_table if whole else block_table[:num_decodes]
        per_req = batch.query_lens
        if per_req is not None and not whole:
            per_req = per_req[:num_decodes]
        return IndexerDecodeMetadata(
            block_table=expanded_rows if layout.flatten else table,
            seq_lens=seq_lens,
            decode_lens=decode_lens,
            requires_padding=layout.requires_padding,
            schedule_metadata=self.schedule_metadata,
            global_seq_lens=global_seq_lens,
            per_req_decode_lens=per_req,
            decode_is_uniform=lens.uniform,
            write_max_decode_len=lens.longest,
        )

    def _cut_decode_views(self, rows: int, width: int, flatten: bool):
        """``(seq_lens (rows, width), global_seq_lens (rows, width), decode_lens (rows,),
        expanded table rows or None)``, cut once per layout (slicing costs over a
        microsecond a view). Without DCP the global lengths are the lengths."""
        seq_lens = self.decode_seq_lens[: rows * width].view(rows, width)
        global_seq_lens = (seq_lens if self.decode_global_seq_lens is None
                           else self.decode_global_seq_lens[: rows * width].view(rows, width))
        return (seq_lens, global_seq_lens, self.decode_lens[:rows],
                self.expanded.rows[:rows] if flatten else None)

    def _cut_slot_views(self, num_tokens: int) -> torch.Tensor:
        return self.compressed_slot_mapping[:num_tokens]

    def _write_slot_mapping(self, batch: Batch, num_tokens: int) -> torch.Tensor:
        if self.compressed_slot_mapping is None:
            return batch.slot_mapping
        compressed_slot_mapping(
            self.backend, batch.query_start_loc, batch.positions, batch.token_to_req,
            self.index.table(batch), self.compressed_slot_mapping, num_reqs=batch.num_reqs,
            num_tokens=num_tokens, storage_block_size=self.index.storage_block_size,
            compress_ratio=self.compress_ratio, dcp=self.dcp,
            gate=self.index.slot_gate(batch, self.config.sliding_window or 0),
        )
        return self._slot_views(num_tokens)
