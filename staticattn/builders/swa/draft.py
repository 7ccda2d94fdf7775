"""The DSpark draft step's sliding-window metadata (``docs/spec/deepseek-v41.md`` §7.5,
§9.2), for the draft model's SWA-only layers, built inside the draft step's own graph.

DeepSeek V4.1 speculates with DSpark: a uniform draft step (every request ``query_len``
tokens, no prefill) whose layers attend, non-causally, one window per request shared by its
draft block, ``[max(prefix - W, 0), L)``, in rows of ``round_up(W + num_spec, 64)``
(:mod:`staticattn.kernels.swa.draft_rows`). The reference refreshes exactly these fields inside
its FULL draft graph (``update_draft_decode_metadata``): ``is_valid_token``,
``token_to_req`` (here the staging's, already on the device) and the rows with their
lengths; the tile-scheduler holder is a fresh one per build, as for every decode build.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from staticattn.arena import Arena, ArenaConfig, BufferDecl
from staticattn.arena.config import round_up
from staticattn.builders.batch import Batch
from staticattn.builders.contract import bound_config, claim_arena
from staticattn.builders.swa.tile_scheduler import tile_scheduler_metas
from staticattn.errors import ConfigError, InvalidBatchError
from staticattn.kernels.runtime.backend import resolve_backend
from staticattn.kernels.swa.draft_rows import draft_swa_rows

__all__ = ["DraftSWAMetadata", "DraftSWAMetadataBuilder", "draft_swa_width"]


def draft_swa_width(config: ArenaConfig) -> int:
    """``round_up(W + num_speculative_tokens, 64)`` (the reference's
    ``get_dspark_swa_index_width``)."""
    return round_up(config.sliding_window + config.num_speculative_tokens, 64)


@dataclass(slots=True)
class DraftSWAMetadata:
    """The draft step's SWA metadata (``T = num_reqs * query_len`` tokens).

    Attributes
    ----------
    is_valid_token : bool device ``(T,)``
    token_to_req_indices : int32 device ``(T,)``
        The staging's request of each token (padded tokens 0).
    swa_indices : int32 device ``(T, 1, width)``
        Each token's request window, flat SWA slots, -1 after; -1 rows for invalid tokens.
    swa_lens : int32 device ``(T,)``
        ``L - max(prefix - W, 0)``; 0 for invalid tokens.
    seq_lens, query_start_loc, block_table : the batch's views
    num_reqs, num_tokens, window_size, index_width : int
    tile_scheds : dict of str to holder
        A fresh holder for "swaonly" (the draft layers' type), None for the others.
    """

    is_valid_token: torch.Tensor
    token_to_req_indices: torch.Tensor
    swa_indices: torch.Tensor
    swa_lens: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    block_table: torch.Tensor
    num_reqs: int
    num_tokens: int
    window_size: int
    index_width: int
    tile_scheds: dict[str, Any] = field(default_factory=dict)


class DraftSWAMetadataBuilder:
    """Builds :class:`DraftSWAMetadata` for uniform draft steps of ``query_len`` tokens per
    request (default ``next_n``): ``build`` eagerly, ``build_decode`` inside the draft
    step's graph (the real token count from ``batch.step_counts``). No ``build_mixed``: a
    draft step is always uniform.

    Buffers (``T = min(max_num_batched_tokens, max_num_seqs * query_len)``, ``Wd =``
    :func:`draft_swa_width`): ``swa_draft.is_valid_token`` bool ``(T,)``,
    ``swa_draft.swa_indices`` int32 ``(T, 1, Wd)``, ``swa_draft.swa_lens`` int32 ``(T,)``.
    Raises :class:`ConfigError` when ``W + query_len`` exceeds ``Wd`` (a window that does not
    fit its row) or the model has no window.
    """

    name = "swa_draft"
    arena: Arena | None = None  # the arena bound to, for life

    def __init__(self, *, query_len: int | None = None) -> None:
        self.query_len = query_len
        self._backend = "torch"
        self._views: dict[str, torch.Tensor] = {}

    def _extent(self, config: ArenaConfig) -> tuple[int, int, int]:
        if config.sliding_window is None:
            raise ConfigError("the draft SWA builder needs config.sliding_window")
        q = config.next_n if self.query_len is None else self.query_len
        width = draft_swa_width(config)
        if config.sliding_window + q > width:
            raise ConfigError(f"a draft window of W + query_len = {config.sliding_window + q} "
                              f"does not fit its row of round_up(W + num_spec, 64) = {width}")
        return q, min(config.max_num_batched_tokens, config.max_num_seqs * q), width

    def buffers(self, config: ArenaConfig) -> list[BufferDecl]:
        """The ``swa_draft.*`` declarations (class docstring)."""
        _, t, width = self._extent(config)
        return [BufferDecl("swa_draft.is_valid_token", (t,), torch.bool),
                BufferDecl("swa_draft.swa_indices", (t, 1, width), torch.int32, fill=-1),
                BufferDecl("swa_draft.swa_lens", (t,), torch.int32)]

    def bind(self, arena: Arena) -> None:
        """Take the ``swa_draft.*`` views of an allocated arena."""
        self._extent(arena.config)
        claim_arena(self, arena)
        self._views = {name: arena[f"swa_draft.{name}"]
                       for name in ("is_valid_token", "swa_indices", "swa_lens")}
        self._backend = resolve_backend(arena.config.kernel_backend, arena.device)

    def build(self, batch: Batch) -> DraftSWAMetadata:
        """Eagerly: every token of the batch is the step's."""
        return self._build(batch, batch.num_actual_tokens)

    def build_decode(self, batch: Batch) -> DraftSWAMetadata:
        """Graph-safe: the real token count from ``batch.step_counts``; one kernel."""
        return self._build(batch, batch.require_step_counts())

    def _build(self, batch: Batch, counts) -> DraftSWAMetadata:
        cfg = bound_config(self)
        q, cap, width = self._extent(cfg)
        t = batch.num_actual_tokens
        if t != batch.num_reqs * q or t > cap or batch.swa_block_table is None:
            raise InvalidBatchError(f"a draft step is uniform: {batch.num_reqs} requests of "
                                    f"query_len={q} tokens (at most {cap}) with an SWA block "
                                    f"table; got {t} tokens")
        v = self._views
        draft_swa_rows(self._backend, v["swa_indices"], v["swa_lens"], v["is_valid_token"],
                       batch.slot_mapping, batch.token_to_req, batch.query_start_loc,
                       batch.seq_lens, batch.swa_block_table,
                       swa_block_size=cfg.swa_block_size, window=cfg.sliding_window,
                       num_tokens=t, counts=counts)
        return DraftSWAMetadata(
            v["is_valid_token"][:t], batch.token_to_req[:t], v["swa_indices"][:t],
            v["swa_lens"][:t], batch.seq_lens, batch.query_start_loc, batch.swa_block_table,
            batch.num_reqs, t, cfg.sliding_window, width,
            tile_scheduler_metas(("swaonly",), t))
