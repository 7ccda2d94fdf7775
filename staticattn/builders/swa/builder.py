"""DeepSeek V4 sparse sliding-window (SWA) metadata, with the C128A top-k, graph-safe.

The reference splits this work over two builders (its SWA builder and the FlashMLA-sparse
builder's C128A part, spec §6-§7) and several launches per step. Here one kernel over the
step's tokens writes the validity mask, the SWA window rows and the C128A decode and prefill
rows (:mod:`staticattn.kernels.swa_decode`); a second one, when the step may have prefills,
writes the prefill gather lengths (:mod:`staticattn.kernels.swa_prefill`).

Differences from the reference, each on purpose:

* one decode threshold, ``config.decode_threshold`` (= ``next_n``), exposed both as
  ``decode_threshold`` and ``reorder_batch_threshold``: the reference leaves the latter at 1,
  which pulls the engine's reorder threshold down under MTP (spec §3.1, §11 item 3);
* the token -> request map and the positions come from the staging kernel on the device (no
  pinned host tensor per step); ``token_to_req_indices`` covers every token of the step,
  padded tokens mapping to request 0;
* invalid (slot -1) and padded decode tokens get length 0 *and* a row of -1 in both the SWA
  and the C128A outputs; the reference leaves their SWA rows stale and writes their C128A rows
  from stale positions (spec §6.6, §10.7, §11 item 5). Reads of the block tables are masked
  to the entries a row keeps, so no read spills past a request's row (spec §7);
* decode rows are bounded by ``max_decode_tokens`` (= ``max_num_seqs * next_n``), not
  ``max_num_batched_tokens``; the C128A row stride is the buffer's, fixed by the config;
* the C128A prefill rows come with their lengths (``c128a_prefill_lens``), and rows past
  the real prefill tokens hold -1.

Decode context parallelism (``dcp_world_size = W > 1``): **replicated**. Every rank holds
the whole window and every C128A entry, and every rank's metadata is the single-GPU one: the
window is small (128 tokens, one or two SWA blocks), C128A covers the whole context at 1/128
(8,192 entries at 1M tokens), so sharding either would buy little memory for an all-gather
per layer; and the reference V4.1 work keeps the SWA and compressor state replicated ("SWA
counted once in attention", spec vllm-0.33-delta.md §4.1). So the SWA block table and the
slot mapping (the SWA group's) are global -- ``cdiv(max_model_len, swa_block_size)`` columns,
every token written on every rank -- and the C128A entries are addressed through the rank's
main block table, whose column spans ``block_size * W`` tokens under DCP: a C128A page holds
``block_size * W // 128`` entries (``W`` times the single-GPU page), all of that column's
entries on every rank.
"""

from __future__ import annotations

import functools

import torch

from staticattn.arena import Arena, ArenaConfig, BufferDecl
from staticattn.builders.attention_utils.split import DecodePrefillSplit, split_decodes_and_prefills
from staticattn.builders.batch import Batch
from staticattn.builders.contract import claim_arena
from staticattn.builders.swa.metadata import SparseSWAMetadata
from staticattn.builders.swa.tile_scheduler import tile_scheduler_metas
from staticattn.builders.validation.values import check_capacity
from staticattn.errors import ArenaError, CapacityError, ConfigError, InvalidBatchError
from staticattn.kernels.backend import resolve_backend
from staticattn.kernels.swa_decode import SWADecodeOutputs, build_swa_decode
from staticattn.kernels.swa_prefill import prefill_gather_lens

__all__ = ["SparseSWAMetadataBuilder"]


class SparseSWAMetadataBuilder:
    """Builds :class:`SparseSWAMetadata` into arena views.

    Workflow: ``buffers(config)`` declares the ``swa.*`` views, ``bind(arena)`` takes them;
    then ``build(batch)`` serves any batch eagerly, ``build_decode(batch)`` the static
    uniform decode batch and ``build_mixed(batch)`` a step of any composition within a token
    bucket, both inside a CUDA graph capture.

    Examples
    --------
    >>> from staticattn.builders import make_arena
    >>> cfg = ArenaConfig.deepseek_v4(max_model_len=4096, max_num_seqs=8, device="cpu",
    ...                               kernel_backend="torch")
    >>> builder = SparseSWAMetadataBuilder()
    >>> arena, inputs = make_arena(cfg, [builder])
    >>> counts = inputs.stage([2, 2], [100, 300], [-1] * 4)
    >>> inputs.copy_to_device(2, 4)
    >>> meta = builder.build_decode(Batch.for_decode_capture(inputs, 2))
    >>> tuple(meta.decode_swa_indices.shape), tuple(meta.c128a_decode_indices.shape)
    ((4, 1, 128), (4, 1, 128))
    """

    name = "swa"
    arena: Arena | None = None  # the arena bound to, for life

    def __init__(self) -> None:
        self._config: ArenaConfig | None = None
        self._backend = "torch"
        self._out: SWADecodeOutputs | None = None
        self._gather_lens = None
        self._prefill_seq_lens = None
        self.layer_types: tuple[str, ...] = ()
        self._dense = (1, 0)

    # ------------------------------------------------------------------ contract
    def buffers(self, config: ArenaConfig) -> list[BufferDecl]:
        """The ``swa.*`` views (``Td = max_decode_tokens``, ``T = max_num_batched_tokens``,
        ``W = sliding_window``, ``maxC = dense_width``):

        * ``swa.is_valid_token`` bool ``(T,)``;
        * ``swa.decode_swa_indices`` int32 ``(Td, 1, W)``, ``swa.decode_swa_lens`` int32
          ``(Td,)``;
        * ``swa.prefill_gather_lens``, ``swa.prefill_seq_lens`` int32 ``(max_num_seqs,)``;
        * with a layer type that reads every compressed entry (C128A, the table's
          :attr:`~staticattn.model.Reads.ALL`): ``swa.c128a_decode_indices`` int32
          ``(Td, 1, maxC)``, ``swa.c128a_decode_lens`` int32 ``(Td,)``,
          ``swa.c128a_prefill_indices`` int32 ``(T, maxC)``, ``swa.c128a_prefill_lens``
          int32 ``(T,)``. Index rows start as -1: every writer keeps the entries at or
          past a row's length at -1.

        Raises :class:`ConfigError` without ``sliding_window``. Under decode context
        parallelism the same buffers serve (replicated, see the module docstring).
        """
        _check_config(config)
        td, t, w = config.max_decode_tokens, config.max_num_batched_tokens, config.sliding_window
        decls = [
            BufferDecl("swa.is_valid_token", (t,), torch.bool),
            BufferDecl("swa.decode_swa_indices", (td, 1, w), torch.int32, fill=-1),
            BufferDecl("swa.decode_swa_lens", (td,), torch.int32),
            BufferDecl("swa.prefill_gather_lens", (config.max_num_seqs,), torch.int32),
            BufferDecl("swa.prefill_seq_lens", (config.max_num_seqs,), torch.int32),
        ]
        if config.dense_layer_type is not None:
            max_c = config.dense_width
            decls += [
                BufferDecl("swa.c128a_decode_indices", (td, 1, max_c), torch.int32, fill=-1),
                BufferDecl("swa.c128a_decode_lens", (td,), torch.int32),
                BufferDecl("swa.c128a_prefill_indices", (t, max_c), torch.int32, fill=-1),
                BufferDecl("swa.c128a_prefill_lens", (t,), torch.int32),
            ]
        return decls

    def bind(self, arena: Arena) -> None:
        """Take the ``swa.*`` views of an allocated arena."""
        cfg = arena.config
        _check_config(cfg)
        claim_arena(self, arena)
        has_c128a = cfg.dense_layer_type is not None

        def view(name: str):
            return arena[f"swa.{name}"] if has_c128a else None

        self._out = SWADecodeOutputs(
            is_valid_token=arena["swa.is_valid_token"],
            swa_indices=arena["swa.decode_swa_indices"],
            swa_lens=arena["swa.decode_swa_lens"],
            c128a_indices=view("c128a_decode_indices"),
            c128a_lens=view("c128a_decode_lens"),
            c128a_prefill_indices=view("c128a_prefill_indices"),
            c128a_prefill_lens=view("c128a_prefill_lens"),
        )
        self._gather_lens = arena["swa.prefill_gather_lens"]
        self._prefill_seq_lens = arena["swa.prefill_seq_lens"]
        self._backend = resolve_backend(cfg.kernel_backend, arena.device)
        self.layer_types = tuple(t.name for t in cfg.layer_types)
        self._dense = _dense_entries(cfg)
        self._config = cfg
        # Views cut once per split and kept, per binding: a builder bound to another arena
        # must never hand out views of the previous one.
        self._output_views = functools.lru_cache(maxsize=4096)(self._cut_output_views)

    @property
    def decode_threshold(self) -> int:
        """Longest query that is a decode: ``config.decode_threshold`` (= ``next_n``)."""
        return self._bound_config().decode_threshold

    @property
    def reorder_batch_threshold(self) -> int:
        """The threshold the engine reorders by; always equal to :attr:`decode_threshold`."""
        return self._bound_config().decode_threshold

    def build(self, batch: Batch) -> SparseSWAMetadata:
        """Metadata for any batch (decodes first), eagerly.

        Reads the batch's host-side query starts (for the split), never the device.
        Launches one kernel, plus the gather-lengths kernel when the step has prefills.
        """
        cfg = self._bound_config()
        self._check_batch(batch)
        split = split_decodes_and_prefills(batch, decode_threshold=cfg.decode_threshold)
        num_decodes, num_prefills, num_decode_tokens, _ = split
        self._check_decode_rows(num_decode_tokens)
        self._launch(batch, num_decode_tokens, num_decode_tokens, prefill_rows=num_prefills > 0)
        prefill_gather_lens(
            self._backend, batch.seq_lens, batch.query_start_loc, num_decodes, num_prefills,
            cfg.sliding_window, self._gather_lens,
        )
        return self._metadata(batch, split, batch.seq_lens[num_decodes:])

    def build_decode(self, batch: Batch) -> SparseSWAMetadata:
        """Graph-safe metadata for :meth:`Batch.for_decode_capture` (``num_reqs`` requests of
        ``next_n`` tokens; trailing requests may be padding).

        Reads only arena views and static ints, launches one kernel, allocates nothing;
        the returned tensors are the same views on every call for the same size.
        """
        cfg = self._bound_config()
        self._check_batch(batch)
        num_reqs, num_tokens = batch.num_reqs, batch.num_actual_tokens
        if batch.max_query_len != cfg.next_n or num_tokens != num_reqs * cfg.next_n:
            raise InvalidBatchError(
                f"build_decode needs a uniform decode batch of next_n={cfg.next_n} tokens per "
                f"request (Batch.for_decode_capture), got {num_reqs} requests, {num_tokens} "
                f"tokens, max_query_len={batch.max_query_len}; use build() for other batches"
            )
        self._check_decode_rows(num_tokens)
        self._launch(batch, num_tokens, num_tokens, prefill_rows=False)
        return self._metadata(batch, (num_reqs, 0, num_tokens, 0), None)

    def build_mixed(self, batch: Batch) -> SparseSWAMetadata:
        """Graph-safe metadata for a step of any composition within a token bucket
        (:meth:`Batch.for_mixed_capture`: ``R`` requests, ``T`` tokens at most).

        The split is read on the device (``batch.step_counts``); every view covers the
        bucket's capacity and holds defined values past the real step: decode rows
        ``(min(T, max_decode_tokens), ...)`` with length 0 and rows of -1 past ``Td``;
        C128A prefill rows ``(T, maxC)`` likewise past the real prefill tokens; prefill
        gather and sequence lengths ``(R,)``, 0 past the real prefills. The int fields are
        those capacities; the exact split is ``step_counts``. Two kernels.
        """
        cfg = self._bound_config()
        self._check_batch(batch)
        batch.require_step_counts()
        r, t = batch.num_reqs, batch.num_actual_tokens
        rows = min(t, cfg.max_decode_tokens)
        self._launch(batch, 0, rows, prefill_rows=True, step_counts=batch.step_counts)
        prefill_gather_lens(
            self._backend, batch.seq_lens, batch.query_start_loc, 0, r, cfg.sliding_window,
            self._gather_lens, self._prefill_seq_lens, batch.step_counts,
        )
        return self._metadata(batch, (r, r, rows, t), self._prefill_seq_lens[:r])

    # ------------------------------------------------------------------- helpers
    def _bound_config(self) -> ArenaConfig:
        if self._config is None:
            raise ArenaError("SparseSWAMetadataBuilder is not bound; call bind(arena) first")
        return self._config

    def _check_batch(self, batch: Batch) -> None:
        """Static checks only (shapes, presence, capacities): nothing here reads data."""
        cfg = self._bound_config()
        missing = [name for name in ("positions", "token_to_req", "swa_block_table")
                   if getattr(batch, name) is None]
        if missing:
            raise InvalidBatchError(
                f"the SWA builder needs batch.{', batch.'.join(missing)}: build the batch from "
                "the arena (Batch.from_staged / for_decode_capture), whose staging kernel "
                "derives positions and token_to_req"
            )
        num_tokens = batch.num_actual_tokens
        check_capacity(batch.num_reqs, num_tokens, cfg)
        short = [name for name in ("slot_mapping", "positions", "token_to_req")
                 if getattr(batch, name).shape[0] < num_tokens]
        if short:
            raise InvalidBatchError(f"batch.{short[0]} has fewer than num_actual_tokens="
                                    f"{num_tokens} entries")
        if num_tokens and batch.num_reqs == 0:
            raise InvalidBatchError(f"the batch has {num_tokens} tokens but no request")

    def _check_decode_rows(self, num_decode_tokens: int) -> None:
        cfg = self._bound_config()
        if num_decode_tokens > cfg.max_decode_tokens:
            raise CapacityError(
                f"num_decode_tokens={num_decode_tokens} exceeds max_decode_tokens="
                f"{cfg.max_decode_tokens} (max_num_seqs * next_n rows of decode metadata)"
            )

    def _launch(self, batch: Batch, num_decode_tokens: int, decode_rows: int, *,
                prefill_rows: bool, step_counts: torch.Tensor | None = None) -> None:
        cfg = self._bound_config()
        build_swa_decode(
            self._backend, self._out, batch.slot_mapping, batch.positions, batch.token_to_req,
            batch.swa_block_table, cfg.swa_block_size, batch.block_table,
            *self._dense, batch.num_actual_tokens, num_decode_tokens,
            decode_rows=decode_rows, prefill_rows=prefill_rows, step_counts=step_counts,
        )

    def _metadata(self, batch: Batch, split: DecodePrefillSplit,
                  prefill_seq_lens: torch.Tensor | None) -> SparseSWAMetadata:
        cfg = self._bound_config()
        num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens = split
        views = self._output_views(batch.num_actual_tokens, num_decode_tokens, num_prefills,
                                   num_prefill_tokens)
        scheds = tile_scheduler_metas(self.layer_types, num_decode_tokens)
        return SparseSWAMetadata(
            query_start_loc=batch.query_start_loc,
            query_start_loc_cpu=batch.query_start_loc_cpu,
            seq_lens=batch.seq_lens,
            block_table=batch.swa_block_table,
            slot_mapping=batch.slot_mapping,
            block_size=cfg.swa_block_size,
            window_size=cfg.sliding_window,
            token_to_req_indices=batch.token_to_req,
            num_decodes=num_decodes,
            num_prefills=num_prefills,
            num_decode_tokens=num_decode_tokens,
            num_prefill_tokens=num_prefill_tokens,
            prefill_seq_lens=prefill_seq_lens if num_prefills else None,
            tile_scheds=scheds,
            step_counts=batch.step_counts,
            **views,
        )

    def _cut_output_views(self, num_tokens: int, num_decode_tokens: int, num_prefills: int,
                      num_prefill_tokens: int) -> dict[str, torch.Tensor | None]:
        """The builder's own views for a split, cut once per split (slicing costs over a
        microsecond a view, and steps repeat their splits)."""
        out = self._out
        has_c128a = out.c128a_indices is not None
        prefill_c128a = has_c128a and num_prefills > 0
        td, tp = num_decode_tokens, num_prefill_tokens
        return dict(
            is_valid_token=out.is_valid_token[:num_tokens],
            decode_swa_indices=out.swa_indices[:td],
            decode_swa_lens=out.swa_lens[:td],
            c128a_decode_indices=out.c128a_indices[:td] if has_c128a else None,
            c128a_decode_lens=out.c128a_lens[:td] if has_c128a else None,
            prefill_gather_lens=self._gather_lens[:num_prefills] if num_prefills else None,
            c128a_prefill_indices=out.c128a_prefill_indices[:tp] if prefill_c128a else None,
            c128a_prefill_lens=out.c128a_prefill_lens[:tp] if prefill_c128a else None,
        )

def _check_config(config: ArenaConfig) -> None:
    if config.sliding_window is None:
        raise ConfigError(
            "the sparse SWA builder needs config.sliding_window (128 for DeepSeek V4); "
            "this config has none"
        )


def _dense_entries(config: ArenaConfig) -> tuple[int, int]:
    """The dense (C128A) type's compress ratio ``R`` and its entries per main-group
    block-table column: ``block_size // R``, times ``dcp_world_size`` under DCP, where a
    column spans a block on every rank and the replicated page holds all of that column's
    entries. ``(1, 0)`` without such a type."""
    dense = config.dense_layer_type
    if dense is None:
        return 1, 0
    return dense.compress_ratio, config.block_size * config.dcp_world_size // dense.compress_ratio
