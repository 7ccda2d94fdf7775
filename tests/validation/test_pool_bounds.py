"""The KV pool bounds every slot and block id a step addresses, on every entry point.

``GraphOptions(num_kv_blocks=N)`` is required while the manager validates. ``run()`` and the
in-place ``launch`` then refuse, before anything is written, a slot at or past
``N x block size`` (of the group the slots address) and, where the tables are host memory
(a CPU arena), a block id outside ``[0, N)`` in a column a request of the step uses -- in
the main, the SWA and every cache group's table. ``write_blocks`` checks ids as they are
written on any device. Columns past a request's end may hold anything.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.entry_points import enter_step, refused_unchanged
from helpers.support import DEVICE, quiet
from helpers.toy import ToyBuilder, ToyStep

from staticattn.arena import ArenaConfig, cache_groups
from staticattn.builders import make_arena
from staticattn.graphs import GraphManager

POOL = 64
SMALL = dict(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=2048, device=DEVICE)
PRESETS = {
    "deepseek-v3.2": ArenaConfig.preset("deepseek-v3.2", **SMALL),
    "deepseek-v4": ArenaConfig.preset("deepseek-v4", **SMALL),
    "deepseek-v4.1-flash": ArenaConfig.preset("deepseek-v4.1-flash", **SMALL),
}
host_tables = pytest.mark.skipif(DEVICE != "cpu", reason="the steps read host tables only "
                                 "on a CPU arena (write_blocks checks them on CUDA)")


def _world(preset: str):
    cfg = PRESETS[preset]
    b = ToyBuilder()
    arena, inputs = make_arena(cfg, [b])
    gm = GraphManager(arena, inputs, [b], ToyStep(cfg, arena.device), quiet(num_kv_blocks=POOL))
    for name, table in _tables(inputs).items():
        table.fill_(1)  # every row valid: block 1 of the pool
        assert name in gm.block_ids.tables
    return cfg, arena, inputs, gm


def _tables(inputs) -> dict[str, torch.Tensor]:
    tables = {"block_table": inputs.block_table, **inputs.block_tables}
    if inputs.swa_block_table is not None:
        tables["swa_block_table"] = inputs.swa_block_table
    return tables


def _slot_group_block(cfg) -> int:
    return cfg.swa_block_size if cfg.has_swa else cfg.block_size


def _step(cfg, kind: str):
    """(query_lens, seq_lens, slots) of a decode or a mixed step, slots in the pool."""
    n = cfg.next_n
    q = np.array([n, n, n] if kind == "decode" else [n, 7])
    s = np.array([300, 40, 1000][: len(q)])
    return q, s, np.arange(int(q.sum())) + 5


PATHS = [("run", "decode"), ("run", "mixed"), ("launch_decode", "decode"),
         ("launch_step", "decode"), ("launch_step", "mixed")]


@host_tables
@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize("path, kind", PATHS)
@pytest.mark.parametrize("bad", [POOL, -1, 2**31 - 1])
def test_a_block_id_outside_the_pool_is_refused_naming_it(preset, path, kind, bad):
    cfg, arena, inputs, gm = _world(preset)
    q, s, slots = _step(cfg, kind)
    for name, table in _tables(inputs).items():
        table[1, 0] = bad  # request 1 (40 tokens) uses column 0 of every table
        refused_unchanged(gm, arena, enter_step(gm, path, q, s, slots), f"{name}[1, 0]={bad}",
                 f"[0, {POOL})")
        table[1, 0] = 1
        enter_step(gm, path, q, s, slots)()  # the manager still serves the good step


@host_tables
@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize("path, kind", PATHS)
def test_columns_past_a_requests_end_may_hold_anything(preset, path, kind):
    cfg, _, inputs, gm = _world(preset)
    q, s, slots = _step(cfg, kind)
    for name, table in _tables(inputs).items():
        per_column = gm.block_ids.tables[name][1]
        table[1, -(-int(s[1]) // per_column):] = -7  # past request 1's last column
        table[len(q):] = POOL + 3  # rows past the step
    enter_step(gm, path, q, s, slots)()


@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize("path, kind", PATHS)
def test_a_slot_past_the_pool_isrefused_unchanged(preset, path, kind):
    cfg, arena, _, gm = _world(preset)
    q, s, slots = _step(cfg, kind)
    last = POOL * _slot_group_block(cfg) - 1
    slots[-1] = last
    enter_step(gm, path, q, s, slots)()  # the pool's last slot is the step's to write
    slots[-1] = last + 1
    refused_unchanged(gm, arena, enter_step(gm, path, q, s, slots), f"={last + 1}",
             f"{last + 1} slots")


@pytest.mark.parametrize("preset", list(PRESETS))
def test_write_blocks_checks_row_columns_and_ids_before_writing(preset):
    cfg, arena, inputs, gm = _world(preset)
    for name, table in _tables(inputs).items():
        width = table.shape[1]
        ids = np.arange(1, min(width, 3) + 1)
        gm.write_blocks(name, 2, ids)
        assert table[2, : ids.size].tolist() == ids.tolist()
        last = min(width, 2) - 1  # the bad id's column: the second, or a ring's only one
        for args, fragment in [((name, 2, [POOL]), f"{name}[2, 0]={POOL}"),
                               ((name, 2, [1, -1][-width:]), f"{name}[2, {last}]=-1"),
                               ((name, 2, [1, POOL][-width:]), f"{name}[2, {last}]={POOL}"),
                               ((name, cfg.max_num_seqs, [1]), "outside"),
                               ((name, 0, [1], width), "outside"),
                               ((name, 0, np.array([1.0])), "integers"),
                               (("no_such_table", 0, [1]), "no block table")]:
            refused_unchanged(gm, arena, lambda args=args: gm.write_blocks(*args), fragment)


def test_every_cache_group_has_its_table_checked():
    cfg = PRESETS["deepseek-v4.1-flash"]
    _, _, inputs, gm = _world("deepseek-v4.1-flash")
    groups = {g.name for g in cache_groups(cfg)}
    assert groups and groups <= set(gm.block_ids.tables)


def test_a_step_of_no_request_checks_no_block():
    _, _, inputs, gm = _world("deepseek-v4")
    inputs.block_table[0, 0] = POOL
    gm.block_ids.check_step(0, np.zeros(0, np.int64))  # nothing used, nothing to read
