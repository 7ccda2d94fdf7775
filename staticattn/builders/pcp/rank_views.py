"""The prefill-context-parallel buffers of one rank's arena (``prefill-context-parallel.md``
§2, §3.1, §3.2, §8): declared from the :class:`~staticattn.arena.pcp_config.PCPConfig`
capacities next to the rank's input and builder buffers, allocated once, views at fixed
addresses for the rank's life.

* ``pcp.staging.batch`` (host, pinned on CUDA) and ``pcp.batch`` (device), int32
  ``(4, S + 1)``: the staged global batch, one row each for ``query_start_loc``,
  ``is_prefilling``, ``num_computed`` and ``req_state_idx`` (the last three over ``S``
  entries; padded requests: the last query start repeated, 0s). The host writes the first,
  one copy node inside the graph brings it to the second.
* ``pcp.tables.<name>``, int32 device ``(S, columns)``: every request's block row of each
  block table the rank's builders read (``block_table``; with SWA ``swa_block_table``;
  DeepSeek V4.1's ``block_tables.<group>``), updated in place by the engine (the rows that
  changed), like the single-GPU arena's tables.
* ``pcp.rows.*``: every rank's rows and the gathered layout
  (:class:`~staticattn.builders.pcp.rank_rows.RowViews`, ``N`` tokens a rank).
* ``pcp.fields.*``: this rank's row fields
  (:class:`~staticattn.builders.pcp.rank_fields.RankFields`, ``R = 2 S`` rows).
* ``pcp.gathered_slots``, int64 device ``(P * N,)``: the gathered slot mapping of this
  rank's DCP rank.
* under PCP + DCP, ``pcp.extents.*``: the rank's prefill-row KV extents and the global
  chunk plan (:class:`~staticattn.builders.pcp.kv_plan.PrefillExtents`, a workspace of
  ``W`` entries).
* where the model has a ratio-2 compressor ring (DeepSeek V4.1), ``pcp.ring.*``: every
  rank's ring links (:class:`~staticattn.builders.pcp.ring_link.RingLinks`:
  ``prev_row_indices`` int32 ``(P, R)``, ``ring_write_slots`` int64 ``(P * R,)``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from staticattn.arena.buffers import BufferDecl
from staticattn.arena.groups import cache_groups
from staticattn.arena.pcp_config import PCPConfig
from staticattn.builders.pcp.kv_plan import PrefillExtents
from staticattn.builders.pcp.rank_fields import RankFields
from staticattn.builders.pcp.rank_rows import RowViews
from staticattn.builders.pcp.ring_link import RingLinks, ring_buffers, ring_table

__all__ = ["BATCH_ROWS", "PCPLayout", "PCPViews", "pcp_buffers", "table_columns"]

#: Rows of the staged global batch: query starts, prefilling flags, computed tokens, states.
BATCH_ROWS = ("query_start_loc", "is_prefilling", "num_computed", "req_state_idx")


def _decls(prefix: str, meta) -> list[BufferDecl]:
    # The views' dataclass owns their shapes: read them off views on the meta device.
    return [BufferDecl(f"{prefix}.{f.name}", tuple(getattr(meta, f.name).shape),
                       getattr(meta, f.name).dtype) for f in fields(meta)]


def table_columns(config) -> dict[str, int]:
    """The block tables of an arena of ``config`` (an ArenaConfig), by their input view's
    name after ``input.``, and their columns."""
    tables = {"block_table": config.max_blocks_per_req}
    if config.has_swa:
        tables["swa_block_table"] = config.max_swa_blocks_per_req
    tables.update({f"block_tables.{g.name}": g.columns for g in cache_groups(config)})
    return tables


def pcp_buffers(cfg: PCPConfig, num_tokens: int, max_num_tokens: int,
                tables: dict[str, int], workspace: int = 0,
                ring: bool = False) -> list[BufferDecl]:
    """The declarations of one rank's PCP views.

    Parameters
    ----------
    cfg : PCPConfig
        ``S = max_num_seqs`` global requests, ``R = 2 S`` rows a rank, ``P`` ranks.
    num_tokens : int
        ``N``, the tokens every rank pads its rows to (the bucket).
    max_num_tokens : int
        ``T``, the global batch's token capacity (the restore index).
    tables : dict of str to int
        The block tables and their columns (:func:`table_columns`).
    workspace : int
        ``W``, the entries of the PCP + DCP prefill plan (every prefill region, ``D``
        shards each); unused under D = 1.
    ring : bool
        Whether the model has a ratio-2 compressor ring (the ring links' views).
    """
    S, R, P = cfg.max_num_seqs, cfg.max_rows, cfg.pcp_size
    field_decls = [BufferDecl(f"pcp.fields.{f.name}", (R,),
                              torch.bool if f.name == "is_prefilling" else torch.int32)
                   for f in fields(RankFields)]
    extents = (_decls("pcp.extents", PrefillExtents.allocate(cfg, num_tokens, workspace,
                                                             device="meta"))
               if cfg.dcp_size > 1 else [])
    return [BufferDecl("pcp.staging.batch", (len(BATCH_ROWS), S + 1), torch.int32, "host"),
            BufferDecl("pcp.batch", (len(BATCH_ROWS), S + 1), torch.int32),
            *(BufferDecl(f"pcp.tables.{name}", (S, columns), torch.int32)
              for name, columns in tables.items()),
            *_decls("pcp.rows", RowViews.allocate(cfg, num_tokens, max_num_tokens,
                                                  device="meta")),
            *field_decls, *extents, *(ring_buffers(cfg) if ring else []),
            BufferDecl("pcp.gathered_slots", (P * num_tokens,), torch.int64, fill=-1)]


@dataclass(slots=True)
class PCPViews:
    """One rank's PCP views, taken from an arena holding :func:`pcp_buffers`.

    Attributes
    ----------
    host_batch, batch : int32 ``(4, S + 1)`` host staging and its device copy
        (:data:`BATCH_ROWS`).
    tables : dict of str to int32 device ``(S, columns)``
        The global block tables by name (:func:`table_columns`).
    rows : RowViews
    fields : RankFields
    gathered_slots : int64 device ``(P * N,)``
    extents : PrefillExtents or None
        Under PCP + DCP only.
    ring : RingLinks or None
        Where the model has a ratio-2 compressor ring only (DeepSeek V4.1).
    """

    host_batch: torch.Tensor
    batch: torch.Tensor
    tables: dict[str, torch.Tensor]
    rows: RowViews
    fields: RankFields
    gathered_slots: torch.Tensor
    extents: PrefillExtents | None = None
    ring: RingLinks | None = None

    @classmethod
    def bind(cls, arena, ring_capacity: int = 8) -> PCPViews:
        """The views of an arena holding :func:`pcp_buffers` (``ring_capacity``: the
        compressor ring's rows a request, where the arena holds the ring links)."""
        views = lambda kind, prefix: kind(**{f.name: arena[f"{prefix}.{f.name}"]  # noqa: E731
                                             for f in fields(kind)})
        tables = {name[len("pcp.tables."):]: arena[name] for name in arena.names()
                  if name.startswith("pcp.tables.")}
        return cls(arena["pcp.staging.batch"], arena["pcp.batch"], tables,
                   views(RowViews, "pcp.rows"), views(RankFields, "pcp.fields"),
                   arena["pcp.gathered_slots"],
                   views(PrefillExtents, "pcp.extents") if "pcp.extents.ks" in arena
                   else None,
                   RingLinks(arena["pcp.ring.prev_row_indices"],
                             arena["pcp.ring.ring_write_slots"], ring_table(arena.config),
                             ring_capacity) if "pcp.ring.prev_row_indices" in arena else None)

    def staged(self, name: str) -> torch.Tensor:
        """A row of the device copy of the global batch, int32: ``query_start_loc``
        ``(S + 1,)``, the others ``(S,)``."""
        row = self.batch[BATCH_ROWS.index(name)]
        return row if name == "query_start_loc" else row[:-1]


class PCPLayout:
    """The PCP views as a part :func:`~staticattn.builders.make_arena` declares and binds
    beside the builders (``name``, ``buffers(config)``, ``bind(arena)``); it builds nothing
    itself (:mod:`staticattn.builders.pcp.rank_step` does).

    Parameters
    ----------
    cfg : PCPConfig
    num_tokens, max_num_tokens, workspace : int
        As :func:`pcp_buffers` takes them (the tables, and whether the model has a ratio-2
        compressor ring, come from the arena's config).
    ring_capacity : int
        ``Cap``, the compressor ring's rows a request
        (``staticattn.builders.compressed.ring_capacity``; 8 without speculative decoding,
        the only case V4.1's PCP serves).
    """

    name = "pcp"

    def __init__(self, cfg: PCPConfig, num_tokens: int, max_num_tokens: int,
                 workspace: int = 0, ring_capacity: int = 8) -> None:
        self.cfg = cfg
        self.shape = (num_tokens, max_num_tokens, workspace)
        self.ring_capacity = ring_capacity
        self.arena = None
        self.views: PCPViews | None = None

    def buffers(self, config) -> list[BufferDecl]:
        """:func:`pcp_buffers` of the PCP config, with the block tables of ``config``."""
        N, T, workspace = self.shape
        return pcp_buffers(self.cfg, N, T, table_columns(config), workspace,
                           ring=ring_table(config) is not None)

    def bind(self, arena) -> None:
        """Take the views (:class:`PCPViews`) from the allocated ``arena``."""
        self.arena = arena
        self.views = PCPViews.bind(arena, self.ring_capacity)
