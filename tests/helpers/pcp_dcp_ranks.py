"""Playing the ranks of a PCP + DCP layer test: every rank in one process (the all-gather
played by copying rows), or each rank a process (gloo on CPU, NCCL on CUDA) running the
layer whole in its step.

A *setting* is a module naming the layer under test and its oracle
(``helpers.pcp_dcp_indexer``, ``helpers.pcp_dcp_sparse_mla``); it provides

* ``rank_pieces(world, interleave, device, p, group=None, speculative=0, graphs=False)``:
  rank ``p``'s pieces, a :class:`Pieces`;
* ``draw_steps(world, interleave, seed, speculative)``: ``(steps, single)``, the drawn global
  steps (dicts with the step ``"s"``) and the single GPU's cache;
* ``write_rank(pieces, p, step, single, world, interleave)``: the engine's work before rank
  ``p``'s step but the block rows (its cache shard, its tokens' inputs); returns its tokens'
  global indices (int64 ``(n,)``, CPU), the oracle's split;
* ``rank_problems(pieces, rows, glob, step)``: ``(problems, checked)`` for a rank's
  rows (its pieces: for what else the layer keeps).

Every rank draws the same steps (one seed), so all see the same global batches, inputs and
oracle.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable
from typing import Protocol

import torch
import torch.distributed as dist

from helpers import dcp_workers
from helpers.dcp_workers import join_group
from helpers.op_trace import NoHostReads
from helpers.pcp_views import rank_metadata, write_block_rows
from staticattn.distributed.pcp_rank import PCPRank
from staticattn.distributed.pcp_world import global_batch
from staticattn.reference import pcp_layout

#: Entries a cache page holds (DeepSeek V3.2's caches, the index K's and fp8_ds_mla).
PAGE = 64


class Pieces(Protocol):
    """A rank's pieces: its ``rank``, and its layer in phases -- ``share(batch)`` writes the
    rank's slab of each ``gathered`` buffer (rank-major, ``[dcp_rank]`` its own), the
    all-gather fills the others', ``finish(batch)`` returns the rank's rows."""

    rank: PCPRank
    gathered: tuple[torch.Tensor, ...]
    share: Callable
    finish: Callable


def unique_block_rows(rng, rows: int, cols: int, max_rows: int):
    """int32 ``(rows, cols)`` block rows drawn from ``1 .. max_rows * cols`` without a
    repeat (never the null block 0), so that every rank's share of the keys can be written
    through the same rows (:func:`owned_entries`)."""
    return (1 + rng.permutation(max_rows * cols)[: rows * cols]).reshape(rows, cols).astype(
        "int32")


def owned_entries(table, lengths, world: int, interleave: int, rank: int):
    """Where rank ``rank``'s cache holds each key it owns, by the spec's ownership rule, not
    the package's: yields ``(src_block, src_offset, block, offset)`` for every key ``e <
    lengths[b]`` of request ``b`` with ``(e // I) % D == rank`` -- at local index ``(e //
    (D I)) I + e % I`` through the request's block row, where the single GPU keeps it at
    ``e`` (``table``: int ``(S, width)`` block rows, pages of :data:`PAGE`)."""
    for b, length in enumerate(lengths):
        for e in range(int(length)):
            if (e // interleave) % world != rank:
                continue
            local = (e // (world * interleave)) * interleave + e % interleave
            yield (int(table[b, e // PAGE]), e % PAGE, int(table[b, local // PAGE]),
                   local % PAGE)


def rank_tokens(rank: PCPRank, p: int, s: dict) -> torch.Tensor:
    """Rank ``p``'s tokens of the global step ``s`` by the oracle's split
    (:mod:`staticattn.reference.pcp_layout`; the rank's own comes only with its step):
    their global indices, int64 ``(n,)``, CPU."""
    cfg, batch = rank.pcp, global_batch(s)
    lay = pcp_layout.layout(cfg, batch, rank.num_tokens)
    meta = pcp_layout.rank_metadata(cfg, batch, lay, p, cfg.dcp_rank(p))
    return torch.tensor(meta["token_to_global"], dtype=torch.int64)[: lay.num_tokens[p]]


def stage_rank(setting, pieces: Pieces, p: int, step: dict, single: torch.Tensor, world: int,
               interleave: int):
    """The setting's ``write_rank``, then the rank's metadata (its graph's work before the
    layer, :func:`~helpers.pcp_views.rank_metadata`); returns its batch and its tokens'
    global indices, which the rank's own split must equal."""
    glob = setting.write_rank(pieces, p, step, single, world, interleave)
    batch, _, own = rank_metadata(pieces.rank, p, step["s"])
    assert torch.equal(own.cpu(), glob)
    return batch, glob


def play_in_process(setting, world: int, interleave: int, device: str, seed: int,
                    speculative: int = 0) -> tuple[list[dict], int]:
    """Every rank in this process (on CUDA one GPU plays them all): per drawn step each
    rank's share, the all-gather by copies, each rank's rows checked. Returns the steps and
    the rows checked; asserts that every rank's rows have no problem."""
    ranks = [setting.rank_pieces(world, interleave, device, p, speculative=speculative)
             for p in range(world)]
    steps, single = setting.draw_steps(world, interleave, seed, speculative)
    checked = 0
    for step in steps:
        staged = [stage_rank(setting, r, p, step, single, world, interleave)
                  for p, r in enumerate(ranks)]
        for r, (batch, _) in zip(ranks, staged):
            with NoHostReads():
                r.share(batch)
        for r in ranks:  # the all-gather, rank-major
            for d, other in enumerate(ranks):
                for mine, theirs in zip(r.gathered, other.gathered):
                    mine[d].copy_(theirs[d])
        for p, (r, (batch, glob)) in enumerate(zip(ranks, staged)):
            with NoHostReads():
                rows = r.finish(batch)
            problems, n = setting.rank_problems(r, rows, glob, step)
            assert problems == [], (p, step["s"], problems)
            checked += n
    return steps, checked


def rank_steps(rank: int, out: str, setting: str, world: int, interleave: int, seed: int,
               device: str = "cpu", speculative: int = 0, groups: int = 1) -> None:
    """A rank's process for ``dcp_workers.spawn_ranks`` (``setting``: the setting module's
    name; ``groups * world`` processes; gloo on CPU; on ``device`` "cuda" NCCL, one GPU a
    rank, the rank's step captured in its graph): ``groups`` PCP + DCP groups of ``world``
    ranks side by side, each drawing steps of its own (``seed`` plus its index), so that a
    collective over the wrong group mixes steps that differ; per drawn step the rank's whole
    step (``PCPRank.run``: its rows built from the staged global batch, then the layer with
    its all-gather over its group); records each step's problems, the rows checked and
    whether the rank ran graphs."""
    module = importlib.import_module(setting)
    device = join_group(rank, out, world * groups, device)
    subgroups = [dist.new_group(list(range(g * world, (g + 1) * world))) for g in range(groups)]
    mine, p = divmod(rank, world)
    group = subgroups[mine] if groups > 1 else None
    pieces = module.rank_pieces(world, interleave, device, p, group=group,
                                speculative=speculative, graphs=device != "cpu")
    steps, single = module.draw_steps(world, interleave, seed + mine, speculative)
    record = {"problems": [], "checked": 0, "graph": pieces.rank.graphs}
    if pieces.rank.graphs:
        pieces.rank.capture()
    for step in steps:
        s = step["s"]
        write_block_rows(pieces.rank, s)
        glob = module.write_rank(pieces, p, step, single, world, interleave)
        rows = pieces.rank.run(s["query_lens"], s["is_prefilling"], s["num_computed"],
                               s["req_state_idx"])
        problems, checked = module.rank_problems(pieces, rows, glob, step)
        record["problems"] += problems
        record["checked"] += checked
    del pieces  # the rank's graph holds the group's collectives
    dcp_workers.leave_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


def check_records(records: list[dict]) -> None:
    """Every rank's steps without a problem, and some rows checked."""
    dcp_workers.check_records(records, "checked", every=False)
