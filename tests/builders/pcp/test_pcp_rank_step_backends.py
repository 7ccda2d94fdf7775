"""A PCP rank's whole step build (:func:`~staticattn.builders.pcp.rank_step.build_rank_step`)
on the Triton backend, where the split, the rank's fields and input views, the gathered slot
mapping and the block-table rows are kernels (:mod:`staticattn.kernels.pcp`): every input
view the builders read and every PCP view equal the torch backend's, written over views
holding stale values, and the rank's rows equal the oracle's; for V3.2 alone and under DCP
(interleave 1 and 8, 2 and 4 ranks) and V4.1 (its several block tables and the ring),
every rank, over drawn decode-first steps (decodes, fresh and continued prefills)."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import torch
from helpers.support import DEVICE

from staticattn.builders import make_arena
from staticattn.builders.pcp.rank_step import build_rank_step, input_table
from staticattn.builders.pcp.rank_views import PCPLayout
from staticattn.distributed.pcp_world import (
    PCPSizes,
    configs,
    global_batch,
    random_pcp_step,
    table_columns,
    table_rows,
)
from staticattn.reference import pcp_layout as pcp

SIZES = dict(max_num_tokens=192, max_model_len=512)
STEPS = 6
#: What the Triton arena's views hold before each step: every output is written whole.
STALE = 7

#: (preset, ranks, DCP ranks, interleave, speculative tokens, requests): 64 requests are
#: R = 128 rows a rank, more than one tile of the rank-rows kernel's query starts (R + 1).
SETTINGS = [("deepseek-v3.2", 2, 1, 1, 0, 6), ("deepseek-v3.2", 4, 1, 1, 1, 6),
            ("deepseek-v3.2", 2, 2, 8, 0, 6), ("deepseek-v3.2", 4, 4, 1, 1, 6),
            ("deepseek-v4.1-flash", 2, 1, 1, 0, 6), ("deepseek-v3.2", 2, 1, 1, 0, 64)]


@functools.cache
def _rank(preset: str, world: int, dcp: int, interleave: int, speculative: int,
          requests: int, rank: int, backend: str):
    """``(pcp, arena config, views, inputs)`` of rank ``rank`` (an arena holding its input
    views and PCP views), the backend's kernels on the test device (Triton: compiled on
    CUDA, interpreted on CPU)."""
    sizes = PCPSizes(**SIZES, max_num_seqs=requests, interleave=interleave,
                     num_speculative_tokens=speculative)
    cfg, rank_cfg, _ = configs(preset, world, "cpu", sizes, dcp, rank)
    rank_cfg = rank_cfg.replace(device=DEVICE if backend == "triton" else "cpu",
                                kernel_backend=backend)
    workspace = cfg.max_num_seqs * (rank_cfg.max_model_len
                                    + cfg.dcp_size * cfg.cp_kv_cache_interleave_size)
    layout = PCPLayout(cfg, sizes.num_tokens(world, dcp), sizes.max_num_tokens, workspace)
    _, inputs = make_arena(rank_cfg, [layout])
    return cfg, rank_cfg, layout.views, inputs, sizes


def _run(setting, rank: int, backend: str, step: dict) -> dict[str, torch.Tensor]:
    """Every view the rank's step build writes, after it, on the CPU."""
    cfg, rank_cfg, views, inputs, _ = _rank(*setting, rank, backend)
    if backend == "triton":
        for view in _outputs(views, inputs).values():
            view.fill_(STALE)
    host = views.host_batch
    S = len(step["query_lens"])
    host.zero_()
    host[0, 1:S + 1] = torch.tensor(np.cumsum(step["query_lens"]), dtype=torch.int32)
    host[0, S + 1:] = host[0, S]
    for row, name in enumerate(("is_prefilling", "num_computed", "req_state_idx"), start=1):
        host[row, :S] = torch.tensor(np.asarray(step[name], dtype=np.int64), dtype=torch.int32)
    for name, view in views.tables.items():
        view.zero_()
        view[:S].copy_(table_rows(step["table"], name, rank_cfg)[:, :view.shape[1]])
    build_rank_step(cfg, views, inputs, rank)
    return {k: v.cpu().clone() for k, v in _outputs(views, inputs).items()}


def _outputs(views, inputs) -> dict[str, torch.Tensor]:
    R = views.fields.seq_lens.numel()
    N = views.rows.token_to_global.shape[1]
    out = {f"rows.{f.name}": getattr(views.rows, f.name)
           for f in dataclasses.fields(views.rows)}
    out |= {f"fields.{f.name}": getattr(views.fields, f.name)
            for f in dataclasses.fields(views.fields)}
    out["gathered_slots"] = views.gathered_slots
    out |= {"query_start_loc": inputs.query_start_loc[:R + 1], "seq_lens": inputs.seq_lens[:R],
            "query_lens": inputs.query_lens[:R], "positions": inputs.positions[:N],
            "token_to_req": inputs.token_to_req[:N], "slot_mapping": inputs.slot_mapping[:N],
            "step_counts": inputs.step_counts}
    out |= {f"table.{name}": input_table(inputs, name)[:R] for name in views.tables}
    if views.extents is not None:
        out |= {f"extents.{f.name}": getattr(views.extents, f.name)
                for f in dataclasses.fields(views.extents)}
    if views.ring is not None:
        out |= {"ring.prev": views.ring.prev_row_indices,
                "ring.write": views.ring.ring_write_slots}
    return out


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: "{}-P{}-D{}-I{}-k{}-S{}".format(*s))
def test_the_triton_rank_step_writes_what_the_torch_one_does(setting):
    preset, world, dcp = setting[:3]
    *_, sizes = _rank(*setting, 0, "torch")
    width = max(table_columns(_rank(*setting, 0, "torch")[1]).values())
    rng = np.random.default_rng(world * 10 + dcp)
    step = None
    for s in range(STEPS):
        step = random_pcp_step(rng, sizes, width)
        batch = global_batch(step)
        for rank in range(world):
            cfg = _rank(*setting, rank, "torch")[0]
            want, got = _run(setting, rank, "torch", step), _run(setting, rank, "triton", step)
            for name, value in want.items():
                assert torch.equal(got[name], value), (s, rank, name, got[name], value)
            lay = pcp.layout(cfg, batch, got["rows.token_to_global"].shape[1])
            meta = pcp.rank_metadata(cfg, batch, lay, rank, cfg.dcp_rank(rank))
            n = len(lay.rows[rank])
            assert got["query_start_loc"][:n + 1].tolist() == meta["query_start_loc"]
            assert got["seq_lens"][:n].tolist() == meta["seq_lens"]
            assert got["positions"].tolist() == meta["positions"]
    assert step is not None
