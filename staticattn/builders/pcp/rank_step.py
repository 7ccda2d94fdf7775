"""One rank's prefill-context-parallel build, start to end, on the device
(``prefill-context-parallel.md`` §2, §3.1, §3.2, §8): graph-safe, every write into arena
views, so the whole of it is captured in the rank's graph.

1. the staged global batch is copied to the device (one copy node from the pinned staging);
2. every rank's rows and the gathered layout (:func:`~staticattn.builders.pcp.rank_rows.
   build_rows`), this rank's row fields and the gathered slot mapping of its DCP rank
   (under PCP + DCP also the prefill rows' global chunk plan, :mod:`~staticattn.builders.
   pcp.kv_plan`; where the model has a ratio-2 compressor ring, DeepSeek V4.1, every
   rank's ring links, :mod:`~staticattn.builders.pcp.ring_link`, each request's ring block
   read from column 0 of its row of the ring's table, as the single-GPU compressed builder
   reads it);
3. **the rank-local batch reaches the builders through the rank arena's own input views**:
   this rank's rows are written where the staging kernels of a single-GPU step would write
   a step -- ``query_start_loc`` (``R + 1``, repeating ``N_p`` past the rows),
   ``seq_lens``, ``query_lens``, ``positions``, ``token_to_req`` (the local row of each
   token), ``slot_mapping`` (the rank's own segment of the gathered mapping, in the SWA
   group where the model has one), the rows of every block table (each row's request's row
   of ``pcp.tables.*``; the null block past the rows) and ``step_counts`` -- so every
   builder's unchanged ``build_mixed`` reads the
   rank's rows as a chunked-prefill step of ``R`` requests and ``N`` tokens. The host
   writes nothing of the local batch: it stages the global batch only.

The decode/prefill split in ``step_counts`` is the PCP one (§3.1,
``treat_short_extends_as_decodes=False``): the rank's non-prefilling rows, which come first,
are its decodes; a prefill chunk of one token stays a prefill row.
"""

from __future__ import annotations

import dataclasses

import torch

from staticattn.arena.buffers import NULL_BLOCK_ID
from staticattn.arena.pcp_config import PCPConfig
from staticattn.builders.batch import Batch
from staticattn.builders.pcp.kv_plan import build_prefill_extents
from staticattn.builders.pcp.rank_fields import build_rank_fields, gathered_slots
from staticattn.builders.pcp.rank_rows import build_rows
from staticattn.builders.pcp.rank_views import PCPViews
from staticattn.builders.pcp.ring_link import build_ring_links
from staticattn.builders.pcp.segments import segment_of
from staticattn.kernels.pcp.rank_inputs import (
    gathered_tokens_triton,
    rank_rows_triton,
    table_rows_triton,
)
from staticattn.kernels.pcp.ring_links import ring_links_triton
from staticattn.kernels.runtime.backend import resolve_backend
from staticattn.staging import StepInputs

__all__ = ["build_rank_step", "input_table", "slot_group", "write_local_inputs"]


def slot_group(cfg: PCPConfig, config) -> tuple[PCPConfig, str]:
    """The PCP config and the table of the batch's slot mapping: the SWA group's (its
    block size) where the arena ``config`` has one, else the main group's."""
    if config.has_swa:
        return dataclasses.replace(cfg, block_size=config.swa_block_size), "swa_block_table"
    return cfg, "block_table"


def build_rank_step(cfg: PCPConfig, views: PCPViews, inputs: StepInputs, rank: int) -> None:
    """Steps 1-3 of the module for PCP rank ``rank``: after it, ``inputs`` hold the rank's
    rows (``R = 2 * max_num_seqs`` requests, ``N`` tokens: the extent of
    ``Batch.for_mixed_capture(inputs, R, N)``)."""
    views.batch.copy_(views.host_batch, non_blocking=True)
    qsl, pre = views.staged("query_start_loc"), views.staged("is_prefilling")
    computed, states = views.staged("num_computed"), views.staged("req_state_idx")
    backend = resolve_backend(inputs.config.kernel_backend, qsl.device)
    dcp_rank = cfg.dcp_rank(rank)
    slot_cfg, table = slot_group(cfg, inputs.config)
    if backend == "triton":
        # Five launches and one a block table (kernels/pcp) for the ~200 torch ops below
        # (PCP + DCP: three more for the extents' ~110; V4.1: one for the ring's ~50).
        build_rows(cfg, qsl, pre, computed, views.rows, backend)
        rank_rows_triton(views.rows, views.fields, inputs, rank, dcp_rank, qsl, pre,
                         computed, states, dcp_size=cfg.dcp_size,
                         interleave=cfg.cp_kv_cache_interleave_size)
        gathered_tokens_triton(views.rows, views.tables[table], views.gathered_slots, inputs,
                               rank, dcp_rank, block_size=slot_cfg.block_size,
                               dcp_size=cfg.dcp_size,
                               interleave=cfg.cp_kv_cache_interleave_size)
        for name, rows in views.tables.items():
            table_rows_triton(views.rows, rows, input_table(inputs, name), rank, NULL_BLOCK_ID)
    else:
        pre = pre.bool()
        build_rows(cfg, qsl, pre, computed, views.rows, backend)
        build_rank_fields(cfg, views.rows, rank, dcp_rank, qsl, pre, computed, states,
                          views.fields)
        gathered_slots(slot_cfg, views.rows, views.tables[table], dcp_rank,
                       views.gathered_slots)
        write_local_inputs(views, inputs, rank)
    if views.extents is not None:
        build_prefill_extents(cfg, views.rows, views.fields, rank, views.extents,
                              backend=backend)
    if views.ring is not None:
        ring = views.ring
        if backend == "triton":
            ring_links_triton(views.rows, computed, views.tables[ring.table],
                              ring.prev_row_indices, ring.ring_write_slots, ring.capacity)
        else:
            build_ring_links(views.rows, computed, views.tables[ring.table][:, 0],
                             ring.prev_row_indices, ring.ring_write_slots, ring.capacity)


def write_local_inputs(views: PCPViews, inputs: StepInputs, rank: int) -> None:
    """Write rank ``rank``'s rows into the input views the builders read (step 3).

    ``inputs`` must hold ``R`` requests and ``N`` tokens (its config's ``max_num_seqs`` and
    ``max_num_batched_tokens`` at least); past the rows and tokens every view holds what
    the staging kernels leave there: query length 0, sequence length 0, slot -1, position
    0, request 0, the null block.
    """
    rows, fields = views.rows, views.fields
    R, N = rows.row_req.shape[1], rows.token_to_global.shape[1]
    qsl = rows.query_start_loc[rank]
    num_rows, n_p = rows.num_rows[rank], rows.num_tokens[rank]
    held = torch.arange(R, device=qsl.device) < num_rows
    inputs.query_start_loc[: R + 1].copy_(qsl)
    inputs.seq_lens[:R].copy_(fields.seq_lens)
    inputs.query_lens[:R].copy_(rows.row_len[rank])
    inputs.positions[:N].copy_(rows.positions[rank])
    j = torch.arange(N, device=qsl.device, dtype=qsl.dtype)
    row = segment_of(qsl, j)
    inputs.token_to_req[:N].copy_(torch.where(j < n_p, row, 0))
    inputs.slot_mapping[:N].copy_(views.gathered_slots.view(-1, N)[rank])
    for name, table in views.tables.items():
        local = table.index_select(0, rows.row_req[rank].long())
        input_table(inputs, name)[:R].copy_(torch.where(held[:, None], local, NULL_BLOCK_ID))
    decodes = rows.num_decode_rows[rank]
    decode_tokens = qsl.index_select(0, decodes.long().reshape(1))[0]
    inputs.step_counts.copy_(torch.stack([num_rows, n_p, decodes, decode_tokens]))


def input_table(inputs: StepInputs | Batch, name: str) -> torch.Tensor:
    """The view of block table ``name`` (a ``PCPViews.tables`` name) in a step's inputs or
    a batch, int32 ``(rows, columns)``
    (:func:`~staticattn.builders.pcp.rank_views.table_columns`)."""
    if name.startswith("block_tables."):
        return inputs.block_tables[name[len("block_tables."):]]
    return getattr(inputs, name)
