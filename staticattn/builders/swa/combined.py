"""Per-layer index rows from a step's sparse SWA metadata: the prefill combined rows in
workspace coordinates (``docs/spec/deepseek-v41.md`` §7.2) and the FlashInfer rows in paged
coordinates (§7.3), both needing the layer's top-k, so built per layer (or per index
source) by the step that runs the layers, inside its graph or eagerly.

Outputs go to the builder's row scratch (``swa.row_scratch``, one layer's rows at a time:
each call overwrites the previous one's) or to views the caller owns; nothing is allocated.
From an eager build the rows cover the step's prefill tokens (combined) or all its tokens
(FlashInfer); from a mixed build the bucket's capacity, rows past the real step -1 with
length 0. Kernels: :mod:`staticattn.kernels.swa.combined_rows`,
:mod:`staticattn.kernels.swa.flashinfer_rows`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from staticattn.arena import ArenaConfig
from staticattn.builders.swa.declarations import combined_width, flashinfer_width, topk_columns
from staticattn.builders.swa.metadata import SparseSWAMetadata
from staticattn.errors import ArenaError, InvalidBatchError
from staticattn.kernels.swa.combined_rows import prefill_combined_rows
from staticattn.kernels.swa.flashinfer_rows import flashinfer_rows
from staticattn.model import Reads, layer_type

__all__ = ["IndexRows"]


@dataclass(slots=True, eq=False)
class IndexRows:
    """Builds a layer's combined or FlashInfer rows from :class:`SparseSWAMetadata`.

    Attributes
    ----------
    config : ArenaConfig
    backend : {"torch", "triton"}
    scratch : int32 device ``(max_tokens * width,)``;  scratch_lens : int32 device ``(T,)``
        The builder's row scratch: ``max_tokens`` rows of its widest row, ``width``.
    max_tokens, width : int
    """

    config: ArenaConfig
    backend: str
    scratch: torch.Tensor
    scratch_lens: torch.Tensor
    max_tokens: int
    width: int

    def prefill_combined(self, meta: SparseSWAMetadata, type_name: str,
                         topk: torch.Tensor | None = None, *, topk_width: int | None = None,
                         out: torch.Tensor | None = None,
                         lens_out: torch.Tensor | None = None,
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """The prefill combined rows of a layer of type ``type_name``. A -1 (or
        out-of-range) top-k entry stays -1, for V4's types too: the reference's V4 kernel
        would turn an in-range -1 into ``M i - 1``, another request's workspace row.

        Parameters
        ----------
        meta : SparseSWAMetadata
            The step's metadata (with prefills: an eager build's or a mixed build's).
        topk : int32 device ``(T, >= K)`` or None
            The layer's top-k rows by token (local compressed indices, -1 padded; the
            reference's ``topk_indices_buffer``); required for a top-k type, None for
            SWA-only and for a type reading every entry (``k = c``).
        topk_width : int, optional
            ``K``; default the type's (``index_topk``, 0 for SWA-only, ``maxC`` for C128A,
            which may take a narrower active width here).
        out : int32 ``(>= rows, round_up(K + W + mit, 128))`` contiguous, optional;  lens_out :
        int32 ``(>= rows,)``, optional
            Default: the builder's row scratch.

        Returns
        -------
        (indices, lens) : int32 ``(rows, round_up(K + W + mit, 128))``, ``(rows,)`` (``mit``
            = ``max_image_tokens``, 0 for text models)
            ``rows`` = ``meta.num_prefill_tokens`` (the bucket's tokens from a mixed build).
        """
        t = self._windowed(type_name)
        k = self._topk_width(t, topk, topk_width)
        width = combined_width(self.config, t, k)
        rows = meta.num_prefill_tokens if meta.num_prefills else 0
        out, lens_out = self._outputs(out, lens_out, rows, width)
        if rows:
            plan = meta.prefill_chunk_plans[type_name]
            # Eagerly the real tokens end at the last query start: graph padding after them
            # belongs to no request and gets -1 / 0.
            counts = meta.step_counts if meta.split_on_device else (
                meta.num_decodes, meta.num_decode_tokens,
                int(meta.query_start_loc_cpu[meta.query_start_loc_cpu.shape[0] - 1]))
            prefill_combined_rows(
                self.backend, out, lens_out, meta.positions, meta.token_to_req_indices,
                meta.seq_lens, meta.prefill_gather_lens, plan.chunks, plan.num_chunks,
                topk if t.reads is Reads.TOPK else None, ratio=plan.ratio, topk_width=k,
                window=self.config.sliding_window, num_tokens=rows, counts=counts,
                image_spans=meta.image_spans, max_image_tokens=self.config.max_image_tokens)
        return out, lens_out

    def flashinfer(self, meta: SparseSWAMetadata, type_name: str,
                   topk: torch.Tensor | None = None, *,
                   compressed_block_table: torch.Tensor | None = None,
                   entries_per_page: int | None = None, out: torch.Tensor | None = None,
                   lens_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The FlashInfer rows of a layer of type ``type_name``, every token of the step.

        Parameters
        ----------
        meta : SparseSWAMetadata
        topk : int32 device ``(T, >= K)`` or None
            The layer's top-k rows by token; required for a top-k type.
        compressed_block_table : int32 device ``(num_reqs, cols)`` or None
            The block table of the layer's kv-source compressed cache; required for a
            top-k type.
        entries_per_page : int, optional
            ``S``, compressed entries per page; default ``block_size // R``.
        out : int32 ``(>= rows, W + round_up(K, 4))`` contiguous, optional;  lens_out :
        int32 ``(>= rows,)``, optional

        Returns
        -------
        (indices, lens) : int32 ``(rows, W + round_up(K, 4))``, ``(rows,)``;
            ``rows`` = the step's tokens (the bucket's from a mixed build).
        """
        t = self._windowed(type_name)
        if self.config.image_spans:
            raise ArenaError(
                "FlashInfer rows of a model with image spans are not built: the reference "
                "widens their SWA columns to W + mit only on steps with spans, a width a "
                "graph cannot follow; read prefill_swa_indices (W + mit wide, spans applied)")
        if t.reads is Reads.ALL:
            raise InvalidBatchError(f"{type_name} reads every compressed entry; its FlashInfer "
                                    "rows hold global slots, not a top-k: not served here")
        k = topk_columns(self.config, t)
        if k and t.dcp_sharded and self.config.dcp_world_size > 1:
            raise InvalidBatchError(
                f"{type_name} layers' FlashInfer rows are not built under decode context "
                "parallelism: their compressed columns hold request-local top-k entries "
                "through one table, where a rank holds only its share of them (the decode "
                "operand of CompressedMetadata.decode_topk is the rank's)")
        if k and (topk is None or compressed_block_table is None):
            raise InvalidBatchError(f"{type_name} layers' FlashInfer rows need the layer's "
                                    "topk rows and compressed_block_table")
        rows = meta.slot_mapping.shape[0]
        out, lens_out = self._outputs(out, lens_out, rows, flashinfer_width(self.config, t))
        counts = meta.step_counts if meta.split_on_device else (meta.num_decode_tokens, rows)
        flashinfer_rows(
            self.backend, out, lens_out, meta.slot_mapping, meta.positions,
            meta.token_to_req_indices, meta.block_table, meta.replay_start, topk,
            compressed_block_table, swa_block_size=meta.block_size,
            window=self.config.sliding_window, topk_width=k, ratio=t.compress_ratio,
            entries_per_page=entries_per_page or t.entries_per_block(self.config.block_size),
            num_tokens=rows, counts=counts)
        return out, lens_out

    def _windowed(self, type_name: str):
        t = layer_type(type_name)
        if not t.window or t not in self.config.layer_types:
            raise InvalidBatchError(
                f"{type_name!r} is not a windowed layer type of this model; its types are "
                f"{[x.name for x in self.config.layer_types if x.window]}")
        return t

    def _topk_width(self, t, topk: torch.Tensor | None, topk_width: int | None) -> int:
        k = topk_columns(self.config, t) if topk_width is None else topk_width
        if t.reads is Reads.TOPK and (topk is None or topk.shape[-1] < k):
            raise InvalidBatchError(f"{t.name} layers' combined rows need the layer's topk "
                                    f"rows, at least {k} wide")
        if t.reads is Reads.NONE and k:
            raise InvalidBatchError(f"{t.name} layers read no compressed entries: topk_width "
                                    "must be 0")
        return k

    def _outputs(self, out, lens_out, rows: int, width: int):
        if out is None:
            if width > self.width:
                raise ArenaError(f"rows of {width} entries exceed the row scratch's "
                                 f"{self.width}: pass out=")
            out = self.scratch[: self.max_tokens * width].view(self.max_tokens, width)
        if lens_out is None:
            lens_out = self.scratch_lens
        if out.shape[0] < rows or out.shape[-1] != width or out.stride(0) != width or (
                lens_out.shape[0] < rows):
            raise ArenaError(f"out must be contiguous rows ({rows}, {width}) and lens_out "
                             f"({rows},); got {tuple(out.shape)} (row stride {out.stride(0)}) "
                             f"and {tuple(lens_out.shape)}")
        return out[:rows], lens_out[:rows]
