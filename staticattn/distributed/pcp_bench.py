"""The prefill-context-parallel bench: one process per rank, started by torchrun.

    torchrun --nproc-per-node 2 -m staticattn bench --pcp 2 [--dcp 2] [--reps 200]
             [--pcp-preset deepseek-v3.2] [--json pcp.json]

Per step shape (a random global step of 1, 4 and 8 requests -- decodes and prefills, drawn
once, the same on every rank), every rank replays its graph (the staged global batch's
copy, the PCP split and the rank's rows, the indexer's mixed build, the emulated layer with
its NCCL collectives and the restore) ``reps`` times, each step started on an idle
device with the ranks lined up, and measures:

* host µs of :meth:`PCPRank.run <staticattn.distributed.pcp_rank.PCPRank.run>` (the host
  checks, the staging, the launch) and GPU µs of the step (CUDA events around the launch,
  after the checks and the staging, as the one-GPU step's are taken), p50 and p99;
* the collectives alone: the step's all-gathers (under DCP also the all-reduce) captured
  in a graph of their own and replayed back to back, and their share of the step's GPU
  time;
* the same step on one GPU: the one-rank arena's manager with a token-bucket graph of the
  whole global step;
* the kernel nodes of the rank's graph and of the one-GPU graph (through cuda-python, when
  installed): what a replay launches, which is what a graph's GPU time grows with;
* the ranks' host spread per step (the slowest rank's host µs less the fastest's), p50 and
  p99.

Without CUDA the ranks join over gloo and every step runs eagerly: host times only. Rank 0
prints the table and writes the JSON.
"""

from __future__ import annotations

import functools

import numpy as np
import torch.distributed as dist
from tqdm import tqdm

from staticattn.bench.floor import gpu_times_us, host_times_us
from staticattn.bench.replay import step_times_us
from staticattn.distributed.dcp_bench import (
    WARMUP,
    aligner,
    host_spread,
    report_head,
    time_exchange,
)
from staticattn.distributed.paired import emit
from staticattn.distributed.pcp_world import (
    DEFAULT_SIZES,
    PCPSizes,
    pcp_pair,
    random_pcp_step,
)
from staticattn.distributed.world import join, leave
from staticattn.graphs.introspect import node_census

__all__ = ["run_pcp_bench"]

#: Requests of the timed steps.
STEP_REQUESTS = (1, 4, 8)


def _rank_rows(me, preset: str, reps: int, seed: int, progress: bool,
               sizes: PCPSizes, dcp: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    align = aligner(me.cuda, me.check_group)
    rows = []
    kernels = kernels_1gpu = None
    with pcp_pair(preset, world=me.world, rank=me.rank, group=None, device=me.device,
                  sizes=sizes, seed=seed, dcp=dcp) as pair:
        if me.cuda:
            if pair.rank.graphs:
                pair.rank.capture()
                kernels = _kernel_nodes(node_census(pair.rank.graph))
            pair.single.capture(sizes=(), buckets=(sizes.max_num_tokens,))
            for captured in pair.single.mixed_graphs.values():
                kernels_1gpu = _kernel_nodes(captured.nodes)
        for k in tqdm(STEP_REQUESTS, desc="PCP bench", unit="step",
                      disable=me.rank != 0 or not progress, leave=False):
            step = random_pcp_step(rng, sizes, pair.columns, num_reqs=k)
            pair.write(step)
            run = functools.partial(pair.rank.run, step["query_lens"], step["is_prefilling"],
                                    step["num_computed"], step["req_state_idx"])
            for _ in range(WARMUP):
                run()
            host = host_times_us(run, reps, before=align)
            gpu = (_replay_gpu_times(pair.rank, step, reps, align) if me.cuda
                   else [float("nan")] * reps)
            coll = time_exchange(pair.rank.step.exchange, reps, me.cuda, align)
            single_args = pair.single_args(step)
            host1, gpu1 = step_times_us(pair.single, single_args, None, reps, before=align)
            rows.append(dict(requests=k, tokens=int(single_args[0].sum()), host=host, gpu=gpu,
                             collectives=coll, host_1gpu=host1, gpu_1gpu=gpu1,
                             kernels=kernels, kernels_1gpu=kernels_1gpu))
    return rows


def _replay_gpu_times(rank, step: dict, reps: int, before) -> list[float]:
    """GPU µs of the rank's step per repetition: CUDA events around its launch alone (the
    host checks and the staging run untimed ahead of it, after ``before``), each from an
    idle device with the ranks lined up -- as the one-GPU manager's step times are taken
    (events around a window that began before the checks would count the host's time as
    the GPU's)."""
    args = (step["query_lens"], step["is_prefilling"], step["num_computed"])

    def prepare() -> None:
        before()
        rank.check(*args)
        rank.stage(*args, step["req_state_idx"])

    launch = rank.graph.replay if rank.graph is not None else rank.body
    return gpu_times_us(launch, reps, before=prepare, warmup=0)


def _kernel_nodes(census: dict[str, int] | None) -> int | None:
    """The kernel nodes of a graph's node census; None without one (no cuda-python)."""
    return None if census is None else census.get("kernel", 0)


def run_pcp_bench(world: int, reps: int = 200, seed: int = 0, preset: str = "deepseek-v3.2",
                  json_path: str | None = None, progress: bool = True,
                  sizes: PCPSizes = DEFAULT_SIZES, dcp: int = 1) -> int:
    """Run the bench on this rank of a torchrun launch of ``world`` ranks; the exit status.
    ``json_path``: rank 0 writes the figures as JSON there, or prints them instead of the
    table for "-". ``dcp``: 1 or ``world`` (the KV sharded over the same ranks)."""
    me = join(world, "bench", flag="--pcp")
    if me is None:
        return 2
    rows = _rank_rows(me, preset, reps, seed, progress, sizes, dcp)
    every = [None] * world
    dist.all_gather_object(every, rows, group=me.check_group)
    leave(me)
    if me.rank == 0:
        text, data = _report(every, preset, world, reps, me.cuda, dcp, sizes.decode_threshold)
        emit(text, data, json_path)
    return 0


def _p(values, q: float) -> float | None:
    value = float(np.percentile(values, q))
    return None if value != value else value


def _report(every: list[list[dict]], preset: str, world: int, reps: int,
            cuda: bool, dcp: int, next_n: int) -> tuple[str, dict]:
    # Every preset --pcp serves replays graphs on CUDA (V4.1 on purpose; the reference runs
    # its PCP eagerly), so the mode is the DCP bench's.
    mode, out = report_head(preset, world, reps, cuda)
    out["dcp"], out["next_n"] = dcp, next_n
    fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    lines = [f"PCP bench ({preset}, DCP {dcp}, next-n {next_n}): {world} ranks, {reps} steps "
             f"per step shape, {mode}",
             f"{'reqs':>4} {'tokens':>6} {'rank':>4} | {'host p50':>8} {'p99':>7} | "
             f"{'GPU p50':>7} {'p99':>7} | {'collectives':>11} {'share':>6} | "
             f"{'1 GPU host':>10} {'GPU':>7}"]
    for b, first in enumerate(every[0]):
        for r, ranks in enumerate(every):
            row = ranks[b]
            fig = {f"{key}_{q}": _p(row[key], q) for key in (
                "host", "gpu", "collectives", "host_1gpu", "gpu_1gpu") for q in (50, 99)}
            share = (fig["collectives_50"] / fig["gpu_50"]
                     if cuda and fig["gpu_50"] else None)
            lines.append(
                f"{first['requests']:>4} {first['tokens']:>6} {r:>4} | "
                f"{fmt(fig['host_50']):>8} {fmt(fig['host_99']):>7} | "
                f"{fmt(fig['gpu_50']):>7} {fmt(fig['gpu_99']):>7} | "
                f"{fmt(fig['collectives_50']):>11} "
                f"{'-' if share is None else f'{share:.0%}':>6} | "
                f"{fmt(fig['host_1gpu_50']):>10} {fmt(fig['gpu_1gpu_50']):>7}")
            out["rows"].append({"requests": first["requests"], "tokens": first["tokens"],
                                "rank": r, **fig, "collective_share": share,
                                "kernels": row["kernels"], "kernels_1gpu": row["kernels_1gpu"]})
        spread_50, spread_99 = host_spread([ranks[b]["host"] for ranks in every])
        lines.append(f"{'':>4} {'':>6} {'all':>4} | host spread across ranks per step: p50 "
                     f"{spread_50:.1f} us, p99 {spread_99:.1f} us")
        out["rows"].append({"requests": first["requests"], "tokens": first["tokens"],
                            "rank": "spread", "host_spread_50": spread_50,
                            "host_spread_99": spread_99})
    kernels = [ranks[0]["kernels"] for ranks in every]
    if any(k is not None for k in kernels):
        lines.append("kernel nodes per graph: " + ", ".join(
            f"rank {r} {'-' if k is None else k}" for r, k in enumerate(kernels))
            + f"; 1 GPU {every[0][0]['kernels_1gpu']}")
    lines.append("(microseconds; collectives = the step's collectives "
                 + ("replayed alone, share = of the step's GPU time" if cuda
                    else "run alone, host time") + "; 1 GPU = the same step on a one-rank "
                 "arena, one token-bucket graph)")
    return "\n".join(lines), out
