"""The prefill-context-parallel demo: one process per rank, started by torchrun.

    torchrun --nproc-per-node 2 -m staticattn demo --pcp 2 [--dcp 2] [--steps 200]
             [--pcp-preset deepseek-v3.2]

Each rank builds its own arena (:class:`~staticattn.distributed.pcp_rank.PCPRank`: the PCP
views, the indexer builder, the emulated layer with its collectives; with ``--dcp`` the KV
sharded over the same ranks); on GPUs it captures
one graph holding the copy of the staged global batch, the PCP split and the rank's rows
(V4.1: with the compressor-ring links, although the reference runs V4.1's PCP eagerly),
the builders' mixed builds and the layer with its NCCL all-gathers (without CUDA: gloo,
the same body eagerly). Every rank draws the same random global steps (one seed: decodes
and fresh or continued prefills, and half the time the previous step's requests continued,
:func:`~staticattn.distributed.pcp_world.next_pcp_step`), checks the step against the
group and runs it, each wait bounded by the step deadline
(:func:`~staticattn.distributed.fence.fenced_step`: a rank that dies or stalls is a typed
error on every rank, which then ends with status 3, never a hang). Per step each rank compares

* its restored rows (every token's checksums, through the rank's metadata, the all-gathered
  keys and the restore index; V4.1: with each token's compressed 2-token group, through
  the ring links and the compressor ring) with the single-GPU step on a one-rank arena
  holding every request (the reference builds), exactly;
* its metadata with the oracle (:func:`~staticattn.distributed.pcp_world.rank_mismatches`).

Rank 0 prints the totals and each rank's host time per step (p50, p99), then PASS or FAIL.
"""

from __future__ import annotations

import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from staticattn.distributed.fence import fenced_step
from staticattn.distributed.paired import emit
from staticattn.distributed.pcp_world import (
    DEFAULT_SIZES,
    PCPFence,
    PCPSizes,
    next_pcp_step,
    pcp_pair,
    rank_mismatches,
)
from staticattn.distributed.world import abandon, join, leave
from staticattn.errors import RankFailureError
from staticattn.validation.dcp_step import DEFAULT_DEADLINE

__all__ = ["run_pcp_demo"]


def run_pcp_demo(world: int, steps: int = 100, seed: int = 0, preset: str = "deepseek-v3.2",
                 json_path: str | None = None, progress: bool = True,
                 deadline: timedelta = DEFAULT_DEADLINE, sizes: PCPSizes = DEFAULT_SIZES,
                 dcp: int = 1) -> int:
    """Run the demo on this rank of a torchrun launch of ``world`` ranks; the exit status
    (0 when every step matched on every rank). ``json_path``: rank 0 writes the totals as
    JSON there, or prints them instead of the text for "-". ``deadline``: the step deadline
    (:mod:`staticattn.distributed.fence`). ``sizes``: the run's capacities. ``dcp``: 1 (the
    KV on every rank) or ``world`` (sharded over the same ranks)."""
    me = join(world, "demo", deadline, flag="--pcp")
    if me is None:
        return 2
    mine = _run_steps(me, preset, steps, seed, progress, sizes, dcp)
    totals = [None] * world
    dist.all_gather_object(totals, mine, group=me.check_group)
    if me.rank == 0:
        _report(totals, preset, steps, json_path, dcp, sizes.decode_threshold)
    leave(me)
    return 0 if all(t["mismatches"] == 0 for t in totals) else 1


def _run_steps(me, preset: str, steps: int, seed: int, progress: bool,
               sizes: PCPSizes, dcp: int) -> dict:
    """This rank's totals over ``steps`` random steps; what it builds dies with it, before
    the launch is left."""
    rng = np.random.default_rng(seed)
    host_us, fields, mismatches, replays, tokens = [], {}, 0, 0, 0
    with pcp_pair(preset, world=me.world, rank=me.rank, group=None, device=me.device,
                  sizes=sizes, seed=seed, dcp=dcp) as pair:
        fence = PCPFence(me.world, me.rank, sizes.interleave, pair.rank.pcp,
                         pair.rank.num_tokens, sizes.max_num_tokens)
        if pair.rank.graphs:
            pair.rank.capture()  # every rank captures together
        # Line up before the first step: its deadline is not for the ranks' setup.
        dist.barrier(group=me.check_group)
        step = None
        for _ in tqdm(range(steps), desc=f"PCP demo, rank {me.rank}", unit="step",
                      disable=me.rank != 0 or not progress, leave=False):
            step = next_pcp_step(rng, sizes, pair.columns, step)
            pair.write(step)
            try:
                with fenced_step(me, fence, *PCPFence.step_arrays(step)):
                    t0 = time.perf_counter()
                    out = pair.run(step)
                    host_us.append((time.perf_counter() - t0) * 1e6)
            except RankFailureError as exc:
                abandon(me, exc)  # here, before the teardown waits on the device
            replays += pair.rank.graph is not None
            tokens += out.shape[0]
            # The single-GPU step runs every step, first: its compressor ring must follow
            # every step, and the rank's is compared with it after both ran.
            equal = torch.equal(out.cpu(), pair.run_single(step).cpu())
            wrong = rank_mismatches(pair, step)
            for name in wrong:
                fields[name] = fields.get(name, 0) + 1
            mismatches += bool(wrong) or not equal
    return {"mismatches": mismatches, "replayed": replays, "tokens": tokens,
            "graphs": pair.rank.graphs,
            "fields": fields, "host_us": np.percentile(host_us, [50, 99]).tolist()}


def _report(totals: list[dict], preset: str, steps: int, json_path: str | None,
            dcp: int, next_n: int) -> None:
    """Rank 0's lines (per rank, then the verdict) or JSON."""
    # Every preset --pcp serves captures on CUDA (V4.1 too, on purpose: the reference runs
    # its PCP eagerly only); only a run without CUDA is eager.
    mode = "graphs (NCCL)" if totals[0]["graphs"] else "eager (gloo, no CUDA)"
    bad = sum(t["mismatches"] for t in totals)
    verdict = "PASS" if bad == 0 else "FAIL"
    lines = [f"PCP demo ({preset}, DCP {dcp}, next-n {next_n}): {len(totals)} ranks, "
             f"{steps} steps each (decodes and prefills split over the ranks), {mode}"]
    for r, t in enumerate(totals):
        p50, p99 = t["host_us"]
        wrong = ", ".join(f"{k} {v}" for k, v in sorted(t["fields"].items())) or "none"
        lines.append(f"rank {r}: replayed {t['replayed']}/{steps}, {t['tokens']} tokens "
                     f"checked, host us per step p50 {p50:.0f} p99 {p99:.0f}, mismatches "
                     f"{t['mismatches']} (metadata fields against the oracle: {wrong})")
    lines.append(f"{verdict}: {len(totals)} ranks x {steps} steps checked against the "
                 f"single-GPU step and the oracle, {bad} mismatches")
    data = {"verdict": verdict, "preset": preset, "dcp": dcp, "next_n": next_n, "mode": mode,
            "steps": steps, "mismatches": bad,
            "ranks": [{"rank": r, **t} for r, t in enumerate(totals)]}
    emit("\n".join(lines), data, json_path)
