"""DeepSeek V4 / V4.1 sparse sliding-window (SWA) metadata, with the dense top-k,
graph-safe.

The reference splits this work over two builders (its SWA builder and the FlashMLA-sparse
builder's dense part, spec §6-§7) and several launches per step. Here one kernel over the
step's tokens writes the validity mask, the SWA window rows, the dense decode rows and the
paged prefill SWA rows (:mod:`staticattn.kernels.swa.swa_rows`); a second one,
when the step may have prefills, writes the prefill gather lengths and every windowed type's
prefill chunk plan (:mod:`staticattn.kernels.swa.prefill_gather`). A uniform decode step is one
launch, a step with prefills two, as before the prefill rows and plans came in.

V4.1's bounded replay (``docs/spec/deepseek-v41.md`` §8.1): prefill windows and gather
lengths are clamped at the batch's ``replay_start`` (decodes carry 0). Per-layer rows that
need a layer's top-k -- prefill combined rows in workspace coordinates (§7.2) and FlashInfer
rows in paged coordinates (§7.3) -- are built from the metadata by :meth:`SparseSWAMetadataBuilder.
prefill_combined_rows` and :meth:`~SparseSWAMetadataBuilder.flashinfer_rows`
(:mod:`.combined`).

Differences from the reference, each on purpose:

* one decode threshold, ``config.decode_threshold`` (= ``next_n``), exposed both as
  ``decode_threshold`` and ``reorder_batch_threshold``: the reference leaves the latter at 1,
  which pulls the engine's reorder threshold down under MTP (spec §3.1, §11 item 3);
* the token -> request map and the positions come from the staging kernel on the device (no
  pinned host tensor per step); ``token_to_req_indices`` covers every token of the step,
  padded tokens mapping to request 0;
* invalid (slot -1) and padded decode tokens get length 0 *and* a row of -1 in both the SWA
  and the dense outputs; the reference leaves their SWA rows stale and writes their dense rows
  from stale positions (spec §6.6, §10.7, §11 item 5). Reads of the block tables are masked
  to the entries a row keeps, so no read spills past a request's row (spec §7);
* decode rows are bounded by ``max_decode_tokens`` (= ``max_num_seqs * next_n``), not
  ``max_num_batched_tokens``; the dense row stride is the buffer's, fixed by the config;
* the dense prefill rows come with their lengths and live in a workspace of one chunk of
  prefill tokens (``dense_prefill_workspace_bytes``, 16 MiB by default), which the reader
  fills chunk by chunk inside the step (:mod:`.dense_prefill`), where the reference keeps a
  ``(max_num_batched_tokens, maxC)`` buffer (256 MiB at a 1M context); rows past the real
  prefill tokens hold -1, and so do the paged prefill SWA rows (the reference leaves its
  rows past ``Tp`` stale), whose buffer holds ``max_num_batched_tokens`` rows;
* a -1 top-k entry inside a combined row's top-k length stays -1 (V4.1's rule) for every
  type; the reference's V4 kernel adds the request's workspace offset to it, which names
  another request's row (``vllm-0.33-extras.md`` §5.1);
* the chunk plans are also on the device (a table and a count per type, rows past the count
  0) and, from an eager build, on the host; a token bucket's plan covers its real prefill
  requests, not the bucket's spare request slots.

Decode context parallelism (``dcp_world_size = W > 1``): **replicated**. Every rank holds
the whole window and every dense entry, and every rank's metadata is the single-GPU one: the
window is small (128 tokens, one or two SWA blocks), C128A covers the whole context at 1/128
(8,192 entries at 1M tokens), so sharding either would buy little memory for an all-gather
per layer; and the reference V4.1 work keeps the SWA and compressor state replicated ("SWA
counted once in attention", spec vllm-0.33-delta.md §4.1). So the SWA block table and the
slot mapping (the SWA group's) are global -- ``cdiv(max_model_len, swa_block_size)`` columns,
every token written on every rank -- and the dense entries are addressed through the rank's
main block table, whose column spans ``block_size * W`` tokens under DCP: a dense page holds
``block_size * W // 128`` entries (``W`` times the single-GPU page), all of that column's
entries on every rank.
"""

from __future__ import annotations

import torch

from staticattn.arena import Arena, ArenaConfig, BufferDecl
from staticattn.builders.attention_utils.split import split_decodes_and_prefills
from staticattn.builders.batch import Batch
from staticattn.builders.contract import bound_config, claim_arena
from staticattn.builders.swa.combined import IndexRows
from staticattn.builders.swa.declarations import PREFILL_CHUNK_SIZE, swa_buffers
from staticattn.builders.swa.metadata import SparseSWAMetadata
from staticattn.builders.swa.outputs import BoundViews
from staticattn.errors import ArenaError, CapacityError, InvalidBatchError
from staticattn.kernels.runtime.backend import resolve_backend
from staticattn.kernels.swa.prefill_gather import prefill_gather_lens
from staticattn.kernels.swa.swa_rows import build_swa_decode
from staticattn.validation.values import check_capacity

__all__ = ["SparseSWAMetadataBuilder"]


class SparseSWAMetadataBuilder:
    """Builds :class:`SparseSWAMetadata` into arena views.

    Workflow: ``buffers(config)`` declares the ``swa.*`` views, ``bind(arena)`` takes them;
    then ``build(batch)`` serves any batch eagerly, ``build_decode(batch)`` the static
    uniform decode batch and ``build_mixed(batch)`` a step of any composition within a token
    bucket, both inside a CUDA graph capture.

    Parameters
    ----------
    prefill_chunk_size : int
        ``C`` of the chunk plans' area budget (the reference's ``PREFILL_CHUNK_SIZE``, 4).
    name : str
        The metadata key and the buffers' prefix ("swa"); another for a second instance
        (the decoder-replay sub-batch's, :mod:`.decoder_replay`).
    row_scratch : bool
        Declare the per-layer row scratch (:meth:`prefill_combined_rows`,
        :meth:`flashinfer_rows`); without it they need caller-owned outputs.

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
    >>> tuple(meta.decode_swa_indices.shape), tuple(meta.dense_decode_indices.shape)
    ((4, 1, 128), (4, 1, 128))
    """

    arena: Arena | None = None  # the arena bound to, for life

    def __init__(self, *, prefill_chunk_size: int = PREFILL_CHUNK_SIZE, name: str = "swa",
                 row_scratch: bool = True) -> None:
        self.name = name
        self.prefill_chunk_size = prefill_chunk_size
        self.row_scratch = row_scratch
        self._backend = "torch"
        self._views: BoundViews | None = None
        self._dense = (1, 0)

    # ------------------------------------------------------------------ contract
    def buffers(self, config: ArenaConfig) -> list[BufferDecl]:
        """The ``swa.*`` views: :func:`staticattn.builders.swa.declarations.swa_buffers`. Raises
        :class:`ConfigError` without ``sliding_window``. Under decode context parallelism
        the same buffers serve (replicated, see the module docstring)."""
        return swa_buffers(config, self.name, row_scratch=self.row_scratch)

    def bind(self, arena: Arena) -> None:
        """Take the ``swa.*`` views of an allocated arena."""
        cfg = arena.config
        swa_buffers(cfg)  # the config checks
        claim_arena(self, arena)
        self._backend = resolve_backend(cfg.kernel_backend, arena.device)
        self._views = BoundViews(arena, self.name, self._backend, self.prefill_chunk_size)
        self._dense = _dense_entries(cfg)

    @property
    def layer_types(self) -> tuple[str, ...]:
        """The names of the model's layer types (each gets a tile-scheduler holder)."""
        return self._views.layer_types if self._views is not None else ()

    @property
    def rows(self) -> IndexRows | None:
        """The per-layer rows' builder over the row scratch (None without it)."""
        return self._views.rows if self._views is not None else None

    @property
    def decode_threshold(self) -> int:
        """Longest query that is a decode: ``config.decode_threshold`` (= ``next_n``); also
        the threshold the engine reorders by, :attr:`reorder_batch_threshold`."""
        return bound_config(self).decode_threshold

    reorder_batch_threshold = decode_threshold

    def build(self, batch: Batch) -> SparseSWAMetadata:
        """Metadata for any batch (decodes first), eagerly.

        Reads the batch's host-side query starts (for the split and the host chunk plans),
        never the device. Launches one kernel, plus the prefill kernel (gather lengths and
        chunk plans) when the step has prefills.
        """
        cfg = bound_config(self)
        self._check_batch(batch)
        split = split_decodes_and_prefills(batch, decode_threshold=cfg.decode_threshold)
        num_decodes, num_prefills, num_decode_tokens, _ = split
        self._check_decode_rows(num_decode_tokens)
        self._launch(batch, num_decode_tokens, num_decode_tokens, prefill_rows=num_prefills > 0)
        v = self._views
        prefill_gather_lens(
            self._backend, batch.seq_lens, batch.query_start_loc, num_decodes, num_prefills,
            cfg.sliding_window, v.gather_lens, replay_start=batch.replay_start,
            plans=v.plans,
        )
        return v.metadata(batch, split, batch.seq_lens[num_decodes:],
                          v.host_plans(batch, num_decodes) if num_prefills else None)

    def build_decode(self, batch: Batch) -> SparseSWAMetadata:
        """Graph-safe metadata for :meth:`Batch.for_decode_capture` (``num_reqs`` requests of
        ``next_n`` tokens; trailing requests may be padding).

        Reads only arena views and static ints, launches one kernel, allocates nothing;
        the returned tensors are the same views on every call for the same size.
        """
        cfg = bound_config(self)
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
        return self._views.metadata(batch, (num_reqs, 0, num_tokens, 0), None)

    def build_mixed(self, batch: Batch) -> SparseSWAMetadata:
        """Graph-safe metadata for a step of any composition within a token bucket
        (:meth:`Batch.for_mixed_capture`: ``R`` requests, ``T`` tokens at most).

        The split is read on the device (``batch.step_counts``); every view covers the
        bucket's capacity and holds defined values past the real step: decode rows
        ``(min(T, max_decode_tokens), ...)`` with length 0 and rows of -1 past ``Td``;
        paged SWA prefill rows ``(T, ...)`` likewise past the real prefill tokens, and the
        dense prefill rows in ``cdiv(T, Rc)`` chunks (:mod:`.dense_prefill`);
        prefill gather and sequence lengths ``(R,)``, 0 past the real prefills; chunk plans
        as tables with device counts. The int fields are those capacities; the exact split
        is ``step_counts``. Two kernels.
        """
        cfg = bound_config(self)
        self._check_batch(batch)
        batch.require_step_counts()
        r, t = batch.num_reqs, batch.num_actual_tokens
        rows = min(t, cfg.max_decode_tokens)
        self._launch(batch, 0, rows, prefill_rows=True, step_counts=batch.step_counts)
        v = self._views
        prefill_gather_lens(
            self._backend, batch.seq_lens, batch.query_start_loc, 0, r, cfg.sliding_window,
            v.gather_lens, v.prefill_seq_lens, batch.step_counts,
            replay_start=batch.replay_start, plans=v.plans,
        )
        return v.metadata(batch, (r, r, rows, t), v.prefill_seq_lens[:r], split_on_device=True)

    # ------------------------------------------------------------- per-layer rows
    def prefill_combined_rows(self, meta: SparseSWAMetadata, layer_type: str,
                              topk: torch.Tensor | None = None, **kwargs):
        """A layer's prefill rows in workspace coordinates, from any build's ``meta``:
        :meth:`IndexRows.prefill_combined` (``docs/spec/deepseek-v41.md`` §7.2). ``topk``:
        int32 ``(T, >= K)``, the layer's top-k rows by token; returns int32 ``(rows,
        round_up(K + W, 128))`` and ``(rows,)``."""
        return self._bound_rows().prefill_combined(meta, layer_type, topk, **kwargs)

    def flashinfer_rows(self, meta: SparseSWAMetadata, layer_type: str,
                        topk: torch.Tensor | None = None, **kwargs):
        """A layer's FlashInfer rows in paged coordinates, from any build's ``meta``:
        :meth:`IndexRows.flashinfer` (``docs/spec/deepseek-v41.md`` §7.3). ``topk``: int32
        ``(T, >= K)``; returns int32 ``(T, W + round_up(K, 4))`` and ``(T,)``."""
        return self._bound_rows().flashinfer(meta, layer_type, topk, **kwargs)

    # ------------------------------------------------------------------- helpers
    def _bound_rows(self) -> IndexRows:
        bound_config(self)
        if self.rows is None:
            raise ArenaError(f"builder {self.name!r} has no row scratch (row_scratch=False); "
                             "build per-layer rows with a builder that has one")
        return self.rows

    def _check_batch(self, batch: Batch) -> None:
        """Static checks only (shapes, presence, capacities): nothing here reads data."""
        cfg = bound_config(self)
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
        cfg = bound_config(self)
        if num_decode_tokens > cfg.max_decode_tokens:
            raise CapacityError(
                f"num_decode_tokens={num_decode_tokens} exceeds max_decode_tokens="
                f"{cfg.max_decode_tokens} (max_num_seqs * next_n rows of decode metadata)"
            )

    def _launch(self, batch: Batch, num_decode_tokens: int, decode_rows: int, *,
                prefill_rows: bool, step_counts: torch.Tensor | None = None) -> None:
        cfg = bound_config(self)
        build_swa_decode(
            self._backend, self._views.out, batch.slot_mapping, batch.positions,
            batch.token_to_req, batch.swa_block_table, cfg.swa_block_size, batch.block_table,
            *self._dense, batch.num_actual_tokens, num_decode_tokens,
            decode_rows=decode_rows, prefill_rows=prefill_rows, step_counts=step_counts,
            replay_start=batch.replay_start if prefill_rows else None,
            image_spans=batch.image_spans if prefill_rows else None,
            max_image_tokens=cfg.max_image_tokens,
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
