"""Device views of a prefill-context-parallel batch for the builder tests: every rank's rows
(:class:`RowViews`) and one rank's fields (:class:`RankFields`), built from a staged batch,
the oracle's prefill rows of one rank, and a rank's metadata for a drawn global step (the
rank tests of the real consumers)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from helpers.op_trace import NoHostReads
from helpers.support import DEVICE
from staticattn.arena.pcp_config import PCPConfig
from staticattn.builders.pcp.kv_plan import PrefillExtents, build_prefill_extents
from staticattn.builders.pcp.rank_fields import RankFields, build_rank_fields
from staticattn.builders.pcp.rank_rows import RowViews, build_rows
from staticattn.distributed.pcp_rank import PCPRank
from staticattn.distributed.pcp_world import table_rows
from staticattn.reference import pcp_layout as pcp

#: Global token capacity of the drawn steps (6 requests x 40 tokens at most).
MAX_TOKENS = 256


def on_device(views, device):
    """A copy of ``views`` (a dataclass of tensors: RowViews, RankFields, PrefillExtents)
    with every tensor on ``device``."""
    return type(views)(**{f.name: getattr(views, f.name).to(device)
                          for f in dataclasses.fields(views)})


def device_rows(cfg: PCPConfig, inputs: dict[str, torch.Tensor], N: int,
                backend: str = "torch") -> RowViews:
    """Every rank's rows of the staged ``inputs`` (CPU tensors) by ``backend``, on the CPU:
    the Triton kernels run on the test device (compiled on CUDA, interpreted on CPU) and
    their views come back."""
    device = DEVICE if backend == "triton" else "cpu"
    rows = RowViews.allocate(cfg, N, MAX_TOKENS, device)
    build_rows(cfg, *(inputs[k].to(device) for k in ("query_start_loc", "is_prefilling",
                                                     "num_computed")), rows, backend)
    return on_device(rows, "cpu")


def device_extents(cfg: PCPConfig, rows: RowViews, fields: RankFields, p: int,
                   out: PrefillExtents, ratio: int = 1, backend: str = "torch"
                   ) -> PrefillExtents:
    """Rank ``p``'s prefill extents into ``out`` (CPU views) by ``backend``: the Triton
    kernels on the test device, over views holding stale values (every output is written
    whole), their views copied back."""
    if backend != "triton":
        return build_prefill_extents(cfg, rows, fields, p, out, ratio)
    stale = on_device(out, DEVICE)
    for f in dataclasses.fields(stale):
        getattr(stale, f.name).fill_(7)
    got = build_prefill_extents(cfg, on_device(rows, DEVICE), on_device(fields, DEVICE), p,
                                stale, ratio, backend)
    for f in dataclasses.fields(out):
        getattr(out, f.name).copy_(getattr(got, f.name))
    return out


def device_fields(cfg: PCPConfig, rows: RowViews, inputs: dict[str, torch.Tensor],
                  p: int) -> RankFields:
    R = cfg.max_rows
    out = RankFields(*[torch.zeros(R, dtype=torch.int32) for _ in range(4)],
                     torch.zeros(R, dtype=torch.bool),
                     *[torch.zeros(R, dtype=torch.int32) for _ in range(4)])
    return build_rank_fields(cfg, rows, p, cfg.dcp_rank(p), inputs["query_start_loc"],
                             inputs["is_prefilling"], inputs["num_computed"],
                             inputs["req_state_idx"], out)


def prefill_meta(cfg: PCPConfig, batch: pcp.GlobalBatch, lay: pcp.Layout, p: int
                 ) -> dict[str, list[int]]:
    """Rank ``p``'s prefill rows as the oracle sees them: ``req_idx``, ``lens``,
    ``seq_lens``, ``start_pos``, ``shard`` (``dcp_local_seq_lens_upper``) per prefill row and
    ``nd_tokens`` (one entry: the decode tokens in front) and ``region_lens`` (the length
    ``L_k`` of each request among them, in order)."""
    meta = pcp.rank_metadata(cfg, batch, lay, p, cfg.dcp_rank(p))
    qsl = meta["query_start_loc"]
    pre = [r for r, row in enumerate(lay.rows[p])
           if row.length and batch.is_prefilling[row.req]]
    pick = lambda name: [meta[name][r] for r in pre]
    reqs = [lay.rows[p][r].req for r in pre]
    firsts = [k for k in range(len(reqs)) if k == 0 or reqs[k] != reqs[k - 1]]
    region_lens = [batch.num_computed[reqs[k]] + batch.query_lens[reqs[k]] for k in firsts]
    return {"region_lens": region_lens, "req_idx": pick("req_idx"),
            "lens": [qsl[r + 1] - qsl[r] for r in pre],
            "seq_lens": pick("seq_lens"), "start_pos": pick("start_pos"),
            "shard": pick("dcp_local_seq_lens_upper"), "nd_tokens": [qsl[pre[0]] if pre else 0]}


def write_block_rows(rank: PCPRank, s: dict) -> None:
    """The global step ``s``'s block rows (:func:`~staticattn.distributed.pcp_world.
    random_pcp_step`'s ``table``, as :func:`~staticattn.distributed.pcp_world.table_rows`
    gives each table its rows; each table its first columns) into the rank's tables."""
    for name, view in rank.views.tables.items():
        rows = table_rows(s["table"], name, rank.config)
        view[: len(s["query_lens"])].copy_(rows[:, : view.shape[1]].to(view.device))


def rank_metadata(rank: PCPRank, p: int, s: dict) -> tuple[object, dict, torch.Tensor]:
    """Rank ``p``'s batch and metadata for the global step ``s``, and the global index of
    each of its real tokens, int64 ``(n,)``: the step's block rows written, the step
    checked and staged, the rank's rows and every builder's mixed build made."""
    q = np.asarray(s["query_lens"])
    write_block_rows(rank, s)
    rank.check(q, s["is_prefilling"], s["num_computed"])
    rank.stage(q, s["is_prefilling"], s["num_computed"], s["req_state_idx"])
    with NoHostReads():  # what the rank's graph holds
        batch, md = rank.metadata()
    n = int(rank.views.rows.num_tokens[p])
    return batch, md, rank.views.rows.token_to_global[p, :n].long()
