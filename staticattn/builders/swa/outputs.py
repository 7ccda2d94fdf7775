"""The SWA builder's arena views, bound once, and the metadata records cut from them."""

from __future__ import annotations

import functools

import torch

from staticattn.arena import Arena, ArenaConfig
from staticattn.builders.attention_utils.split import DecodePrefillSplit
from staticattn.builders.batch import Batch
from staticattn.builders.swa.chunk_plan import PrefillChunkPlan, host_chunk_plan
from staticattn.builders.swa.combined import IndexRows
from staticattn.builders.swa.declarations import plan_ratio, plan_types, row_scratch_width
from staticattn.builders.swa.dense_prefill import DensePrefillChunks
from staticattn.builders.swa.metadata import SparseSWAMetadata
from staticattn.builders.swa.tile_scheduler import tile_scheduler_metas
from staticattn.kernels.swa.prefill_gather import ChunkPlanViews
from staticattn.kernels.swa.swa_rows import SWADecodeOutputs

__all__ = ["BoundViews"]


class BoundViews:
    """A bound builder's views (``prefix.*`` of ``arena``): what its kernels write, the
    per-layer row scratch when declared, and the metadata of a build.

    Parameters
    ----------
    arena : Arena
    prefix : str
        The builder's buffer prefix ("swa").
    backend : {"torch", "triton"}
    chunk_size : int
        ``C`` of the chunk plans' budget.
    """

    def __init__(self, arena: Arena, prefix: str, backend: str, chunk_size: int) -> None:
        cfg: ArenaConfig = arena.config
        self.config = cfg
        self.backend = backend
        has_dense = cfg.dense_layer_type is not None

        def view(name: str, present: bool = True):
            return arena[f"{prefix}.{name}"] if present else None

        self.out = SWADecodeOutputs(
            is_valid_token=view("is_valid_token"),
            swa_indices=view("decode_swa_indices"),
            swa_lens=view("decode_swa_lens"),
            dense_indices=view("dense_decode_indices", has_dense),
            dense_lens=view("dense_decode_lens", has_dense),
            prefill_swa_indices=view("prefill_swa_indices"),
            prefill_swa_lens=view("prefill_swa_lens"),
        )
        # The dense type's prefill rows: a workspace of one chunk (:mod:`.dense_prefill`).
        self.dense_workspace = (view("dense_prefill_indices"), view("dense_prefill_lens"),
                                cfg.dense_layer_type.compress_ratio) if has_dense else None
        self.gather_lens = view("prefill_gather_lens")
        self.prefill_seq_lens = view("prefill_seq_lens")
        self.types = plan_types(cfg)
        self.plans = ChunkPlanViews(
            view("prefill_chunks"), view("prefill_num_chunks"),
            tuple(plan_ratio(t) for t in self.types),
            cfg.sliding_window + cfg.max_num_batched_tokens, cfg.max_model_len, chunk_size)
        self.rows = None
        if f"{prefix}.row_scratch" in arena:
            self.rows = IndexRows(cfg, backend, view("row_scratch"), view("row_scratch_lens"),
                                  cfg.max_num_batched_tokens, row_scratch_width(cfg))
        self.layer_types = tuple(t.name for t in cfg.layer_types)
        # Views cut once per split and kept, per binding: a builder bound to another arena
        # must never hand out views of the previous one. The dense prefill chunks likewise.
        self._views = functools.lru_cache(maxsize=4096)(self._cut_views)
        self._dense = functools.lru_cache(maxsize=4096)(self._new_dense_chunks)

    def host_plans(self, batch: Batch, num_decodes: int) -> dict[str, list]:
        """Every windowed type's chunk plan from the batch's host lengths (eager only)."""
        _, query_lens, seq_lens = batch.host_arrays()
        return {t.name: host_chunk_plan(seq_lens[num_decodes:], query_lens[num_decodes:],
                                        ratio, self.config.sliding_window,
                                        self.plans.budget(ratio))
                for t, ratio in zip(self.types, self.plans.ratios)}

    def metadata(self, batch: Batch, split: DecodePrefillSplit,
                 prefill_seq_lens: torch.Tensor | None, host_plans: dict | None = None, *,
                 split_on_device: bool = False) -> SparseSWAMetadata:
        """The record of a build with ``split`` ``(D, P, Td, Tp)`` (capacities when
        ``split_on_device``); ``prefill_seq_lens`` int32 ``(P,)`` or None."""
        cfg = self.config
        num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens = split
        views = self._views(batch.num_actual_tokens, num_decode_tokens, num_prefills,
                            num_prefill_tokens)
        plans = {}
        if num_prefills:
            p = self.plans
            plans = {t.name: PrefillChunkPlan(t, ratio, p.chunks[j], p.num_chunks[j : j + 1],
                                              None if host_plans is None
                                              else host_plans[t.name])
                     for j, (t, ratio) in enumerate(zip(self.types, p.ratios))}
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
            tile_scheds=tile_scheduler_metas(self.layer_types, num_decode_tokens),
            step_counts=batch.step_counts,
            prefill_chunk_plans=plans,
            replay_start=batch.replay_start,
            image_spans=batch.image_spans if num_prefills else None,
            positions=batch.positions,
            split_on_device=split_on_device,
            dense_prefill=self._dense_chunks(batch, split, split_on_device),
            **views,
        )

    def _dense_chunks(self, batch: Batch, split: DecodePrefillSplit,
                      split_on_device: bool) -> DensePrefillChunks | None:
        """The step's dense prefill rows by chunk; None without dense layers or prefills."""
        _, num_prefills, num_decode_tokens, num_prefill_tokens = split
        if self.dense_workspace is None or not num_prefills:
            return None
        return self._dense(batch.positions, num_prefill_tokens, num_decode_tokens,
                           batch.num_actual_tokens, batch.step_counts if split_on_device else None)

    def _new_dense_chunks(self, positions: torch.Tensor, *extents) -> DensePrefillChunks:
        """The chunks of one split (kept by ``positions``, the same view step after step, and
        the extents)."""
        indices, lens, ratio = self.dense_workspace
        return DensePrefillChunks(self.backend, indices, lens, positions, ratio, *extents)

    def _cut_views(self, num_tokens: int, num_decode_tokens: int, num_prefills: int,
                   num_prefill_tokens: int) -> dict[str, torch.Tensor | None]:
        """The views of a split, cut once per split (slicing costs over a microsecond a
        view, and steps repeat their splits)."""
        out = self.out
        has_dense = out.dense_indices is not None
        td, tp, pre = num_decode_tokens, num_prefill_tokens, num_prefills > 0
        return dict(
            is_valid_token=out.is_valid_token[:num_tokens],
            decode_swa_indices=out.swa_indices[:td],
            decode_swa_lens=out.swa_lens[:td],
            dense_decode_indices=out.dense_indices[:td] if has_dense else None,
            dense_decode_lens=out.dense_lens[:td] if has_dense else None,
            prefill_gather_lens=self.gather_lens[:num_prefills] if pre else None,
            prefill_swa_indices=out.prefill_swa_indices[:tp] if pre else None,
            prefill_swa_lens=out.prefill_swa_lens[:tp] if pre else None,
        )
