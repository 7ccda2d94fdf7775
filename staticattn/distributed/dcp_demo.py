"""The decode-context-parallel demo: one process per rank, started by torchrun.

    torchrun --nproc-per-node 2 -m staticattn demo --dcp 2 [--steps 500]
             [--dcp-preset deepseek-v4 | deepseek-v3.2 | deepseek-v4.1-flash | ...]

Each rank builds its own arena (``dcp_rank`` = the launcher's rank), the indexer builders
and the reference DCP consumer (:mod:`staticattn.consumers.dcp.dcp_decode`), per index-owning
type (DeepSeek V4.1: c1a and c2a, and the compressed builder whose per-rank decode operand
the consumers attend through); on GPUs it captures one graph per decode size holding the
staging, the rank's builds and the consumers with their NCCL all-gathers (without CUDA:
gloo, every step eager). Every rank draws the same random decode
steps (one seed), writes its share of each request's keys, checks the step against the group
and runs it, each wait bounded by the step deadline
(:func:`~staticattn.distributed.fence.fenced_step`: a rank that dies or stalls is a typed
error on every rank, which then ends with status 3, never a hang). Each rank also runs the
step on a one-rank arena holding every key (the single-GPU step) and compares, per index
type: the top-k exactly, the merged output within float32 rounding (``rtol 1e-4, atol 1e-5``).
Rank 0 prints the totals and the host time per step of every rank (p50, p99).
"""

from __future__ import annotations

import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from staticattn.distributed.fence import fenced_step
from staticattn.distributed.paired import emit, paired_managers
from staticattn.distributed.world import (
    abandon,
    dcp_config,
    graph_pool_blocks,
    join,
    leave,
    random_decode_step,
)
from staticattn.errors import RankFailureError
from staticattn.graphs import EagerBuild, GraphOptions
from staticattn.validation.dcp_step import DEFAULT_DEADLINE

__all__ = ["run_dcp_demo"]


def run_dcp_demo(world: int, steps: int = 200, seed: int = 0,
                 preset: str = "deepseek-v4", json_path: str | None = None,
                 progress: bool = True, deadline: timedelta = DEFAULT_DEADLINE) -> int:
    """Run the demo on this rank of a torchrun launch of ``world`` ranks, with a small arena
    of ``preset`` (one of ``cli.DCP_PRESETS``); the exit status (0 when every step
    matched the single-GPU step on every rank). ``json_path``: rank 0 writes the totals as
    JSON there, or prints them instead of the text for "-". ``progress``: a progress bar on
    rank 0. ``deadline``: the step deadline (:mod:`staticattn.distributed.fence`)."""
    me = join(world, "demo", deadline)
    if me is None:
        return 2
    cfg = dcp_config(preset, world, me.rank, me.device)
    mine = _run_steps(me, cfg, preset, steps, seed, progress)
    totals = [None] * world
    dist.all_gather_object(totals, mine, group=me.check_group)
    if me.rank == 0:
        _report(totals, preset, cfg.next_n, steps, me.cuda, json_path)
    leave(me)
    return 0 if all(t[0] == 0 for t in totals) else 1


def _run_steps(me, cfg, preset: str, steps: int, seed: int, progress: bool) -> tuple:
    """This rank's ``(mismatches, replays, host µs p50 and p99)`` over ``steps`` random
    decode steps; the arenas, consumers and managers it builds die with it, before the
    launch is left."""
    rng = np.random.default_rng(seed)
    host_us, mismatches, replays = [], 0, 0
    options = GraphOptions(progress=False, num_kv_blocks=graph_pool_blocks(cfg))
    with paired_managers(me, cfg, preset, options) as pair:
        if me.cuda:
            pair.rank.capture(buckets=())  # every rank captures the same sizes, in one order
        # Line up before the first step: its deadline is not for the ranks' setup.
        dist.barrier(group=me.check_group)
        for _ in tqdm(range(steps), desc=f"DCP demo, rank {me.rank}", unit="step",
                      disable=me.rank != 0 or not progress, leave=False):
            lengths = pair.write(random_decode_step(cfg, rng))
            try:
                with fenced_step(me, cfg, lengths[0], lengths[1]):
                    t0 = time.perf_counter()
                    res = pair.rank.run(*lengths)
                    host_us.append((time.perf_counter() - t0) * 1e6)
            except RankFailureError as exc:
                abandon(me, exc)  # here, before the managers' teardown waits on the device
            replays += res.mode == "graph"
            got = [x.clone() for x in res.outputs]
            want = pair.single.run(*lengths, eager=EagerBuild.REFERENCE).outputs
            mismatches += not _same(got, want)
    return mismatches, replays, np.percentile(host_us, [50, 99])


def _same(got, want) -> bool:
    """Every index type's ``(ids, out)`` pair of the rank's step equals the single-GPU one:
    the ids exactly, the outputs within float32 rounding."""
    return len(got) == len(want) and all(
        torch.equal(g, w) if not g.is_floating_point()
        else torch.allclose(g, w, rtol=1e-4, atol=1e-5) for g, w in zip(got, want))


def _report(totals: list, preset: str, next_n: int, steps: int, cuda: bool,
            json_path: str | None) -> None:
    """Rank 0's lines (per rank, then the verdict) or JSON."""
    mode = "graphs (NCCL)" if cuda else "eager (gloo, no CUDA)"
    bad = sum(t[0] for t in totals)
    verdict = "PASS" if bad == 0 else "FAIL"
    lines = [f"DCP demo ({preset}, next_n {next_n}): {len(totals)} ranks, {steps} decode "
             f"steps each, {mode}"]
    for r, (mismatches, replayed, (p50, p99)) in enumerate(totals):
        lines.append(f"rank {r}: replayed {replayed}/{steps}, host us per step p50 {p50:.0f} "
                     f"p99 {p99:.0f}, mismatches against the single-GPU step {mismatches}")
    lines.append(f"{verdict}: {len(totals)} ranks x {steps} steps checked against the "
                 f"single-GPU step, {bad} mismatches")
    data = {"verdict": verdict, "preset": preset, "mode": mode, "steps": steps,
            "mismatches": bad,
            "ranks": [{"rank": r, "replayed": t[1], "mismatches": t[0],
                       "host_us_p50": float(t[2][0]), "host_us_p99": float(t[2][1])}
                      for r, t in enumerate(totals)]}
    emit("\n".join(lines), data, json_path)
