"""The decode-context-parallel bench: one process per rank, started by torchrun.

    torchrun --nproc-per-node 2 -m staticattn bench --dcp 2 [--batch-requests 1 8 16] [--reps 200]
             [--preset deepseek-v4 | deepseek-v3.2 | deepseek-v4.1-flash | ...]
             [--json dcp.json]

Per batch size (a uniform decode step of that many requests, lengths drawn once), every rank
replays its graph (staging + the rank's builds + the reference DCP consumers with their
NCCL all-gathers, one per index-owning type) ``reps`` times, each step started on an idle
device, and measures:

* host µs of ``GraphManager.run`` and GPU µs of the step (CUDA events, in a second pass),
  p50 and p99;
* the collectives alone: the consumers' two all-gathers each of the same extent captured in a
  graph of their own and replayed back to back (GPU µs per replay), and their share of the
  step's GPU time (which, timed one step at a time, also holds the ranks' skew);
* NCCL's latency floor: as many all-gathers of one float each, captured and replayed the
  same way: when the collectives cost what it does, they are bound by each all-gather's
  fixed latency, not by the bytes they move;
* host jitter across ranks: per step, the spread (max - min over the ranks) of the host
  time, p50 and p99;
* the same step on one GPU: a one-rank arena over every key, its graph replayed the same way.

Before each timed repetition the ranks line up (an untimed one-element all-reduce), so that
a collective does not time the other rank's launch delay.

Without CUDA the ranks join over gloo and every step runs eagerly: host times only, which
say nothing of a GPU run (the plumbing is what runs there). Rank 0 prints the table and
writes the JSON.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from staticattn.bench.floor import host_times_us, replay_gpu_times_us
from staticattn.bench.replay import step_times_us
from staticattn.consumers.dcp.merge import gather_rank_major
from staticattn.distributed.paired import emit, paired_managers
from staticattn.distributed.world import (
    dcp_config,
    graph_pool_blocks,
    join,
    leave,
    random_decode_step,
)
from staticattn.graphs import GraphManager, GraphOptions
from staticattn.graphs.capturer import capture, warm_up

__all__ = ["aligner", "host_spread", "latency_floor", "report_head", "run_dcp_bench",
           "time_exchange"]

WARMUP = 10
COLLECTIVE_INNER = 20


def aligner(cuda: bool, group) -> Callable[[], None]:
    """An untimed rendezvous of the ranks before each timed repetition, so that a step's
    collectives do not time the other rank's launch delay: a one-element NCCL all-reduce
    and a device sync on GPUs, a barrier of ``group`` (gloo) on CPU."""
    if not cuda:
        return functools.partial(dist.barrier, group=group)
    one = torch.ones(1, device="cuda")

    def align() -> None:
        dist.all_reduce(one)
        torch.cuda.synchronize()

    return align


def _time_steps(gm: GraphManager, lengths, reps: int,
                align: Callable[[], None]) -> tuple[list, list]:
    """Host µs of ``run`` and GPU µs of the step, per step, each from an idle device with
    the ranks lined up, after a warm-up."""
    for _ in range(WARMUP):
        gm.run(*lengths)
    return step_times_us(gm, lengths, None, reps, before=align)


def _time_collectives(consumer, entries: int, reps: int, cuda: bool,
                      align: Callable[[], None]) -> list[float]:
    """GPU µs (CUDA: replays of a graph of them alone) or host µs (gloo) of the consumer's
    all-gathers over ``entries``, the ranks lined up before each sample. On GPUs a sample is
    the mean of ``COLLECTIVE_INNER`` back-to-back replays: what the ranks' host skew adds to
    the first (tens of µs, as much as the all-gathers themselves) is spread over them, so
    the figure is the all-gathers' own cost."""
    return time_exchange(functools.partial(consumer.exchange, entries), reps, cuda, align)


def time_exchange(exchange: Callable[[], None], reps: int, cuda: bool,
                  align: Callable[[], None]) -> list[float]:
    """GPU µs of ``exchange`` (a step's collectives) captured alone and replayed, the mean
    of ``COLLECTIVE_INNER`` back-to-back replays a sample; host µs over gloo."""
    if not cuda:
        exchange()
        return host_times_us(exchange, reps, before=align)
    stream = torch.cuda.Stream()
    warm_up(exchange, stream)  # the communicator is ready before the capture
    graph, _ = capture(exchange, stream)
    return replay_gpu_times_us(graph, reps, before=align, inner=COLLECTIVE_INNER)


def latency_floor(count: int, world: int, rank: int, reps: int, cuda: bool,
                  align: Callable[[], None], group=None) -> list[float]:
    """:func:`time_exchange` of ``count`` all-gathers of one float32 a rank over ``group``:
    what ``count`` collectives cost before they move any data."""
    one = torch.zeros(world, 1, device="cuda" if cuda else "cpu")

    def gathers() -> None:
        for _ in range(count):
            gather_rank_major(one, world, rank, group)

    return time_exchange(gathers, reps, cuda, align)


def host_spread(hosts) -> tuple[float, float]:
    """p50 and p99 over the steps of the ranks' host spread: per step, the slowest rank's
    host µs less the fastest's. ``hosts``: ``(world, reps)``."""
    hosts = np.asarray(hosts, dtype=np.float64)
    spread = hosts.max(axis=0) - hosts.min(axis=0)
    return _p(spread, 50), _p(spread, 99)


def _p(values, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def _plain(value):
    """NaN (a figure not measured here) as null, which JSON has."""
    return None if isinstance(value, float) and value != value else value


def run_dcp_bench(world: int, batches=(1, 8, 16), reps: int = 200, seed: int = 0,
                  preset: str = "deepseek-v4", json_path: str | None = None,
                  progress: bool = True) -> int:
    """Run the bench on this rank of a torchrun launch of ``world`` ranks (batch sizes in
    requests, ``preset`` one of ``cli.DCP_PRESETS``); the exit status. ``json_path``:
    rank 0 writes the figures as JSON there, or prints them instead of the table for "-".
    ``progress``: a progress bar over the batch sizes on rank 0."""
    me = join(world, "bench")
    if me is None:
        return 2
    cfg = dcp_config(preset, world, me.rank, me.device)
    rows = _rank_rows(me, cfg, preset, batches, reps, seed, progress)
    every = [None] * world
    dist.all_gather_object(every, rows, group=me.check_group)
    leave(me)
    if me.rank == 0:
        report = _report(every, preset, cfg, world, reps, me.cuda)
        rows = [{k: _plain(v) for k, v in row.items()} for row in report["rows"]]
        emit(report["text"], {**{k: v for k, v in report.items() if k != "text"},
                              "rows": rows}, json_path)
    return 0


def _rank_rows(me, cfg, preset: str, batches, reps: int, seed: int,
               progress: bool) -> list[dict]:
    """This rank's figures per batch size; the arenas, consumers and managers it builds die
    with it, before the launch is left."""
    n = cfg.next_n
    sizes = [k * n for k in batches]
    rng = np.random.default_rng(seed)  # one seed: every rank times the same steps
    align = aligner(me.cuda, me.check_group)
    rows = []
    options = GraphOptions(progress=False, time_gpu=me.cuda, num_kv_blocks=graph_pool_blocks(cfg))
    with paired_managers(me, cfg, preset, options) as pair:
        if me.cuda:
            # Every rank captures the same sizes, in one order.
            pair.rank.capture(sizes, buckets=())
            pair.single.capture(sizes, buckets=())
        for k in tqdm(batches, desc="DCP bench", unit="batch size",
                      disable=me.rank != 0 or not progress, leave=False):
            lengths = pair.write(random_decode_step(cfg, rng, num_reqs=k))
            host, gpu = _time_steps(pair.rank, lengths, reps, align)
            consumer = pair.consumers[0]
            coll = _time_collectives(consumer, k * n, reps, me.cuda, align)
            floor = latency_floor(consumer.collectives, me.world, me.rank, reps, me.cuda,
                                  align)
            host1, gpu1 = _time_steps(pair.single, lengths, reps, align)
            rows.append(dict(batch=k, host=host, gpu=gpu, collectives=coll, floor=floor,
                             host_1gpu=host1, gpu_1gpu=gpu1))
    return rows


def report_head(preset: str, world: int, reps: int, cuda: bool) -> tuple[str, dict]:
    """A multi-rank bench's mode (what ran, in words) and the start of its JSON."""
    mode = "graphs (NCCL)" if cuda else "eager (gloo, no CUDA: host times of eager steps only)"
    return mode, {"preset": preset, "world": world, "reps": reps, "mode": mode, "rows": [],
                  "device": torch.cuda.get_device_name() if cuda else "cpu"}


def _report(every: list[list[dict]], preset: str, cfg, world: int, reps: int,
            cuda: bool) -> dict:
    """The table (medians and p99 per rank and batch) and its raw figures."""
    mode, out = report_head(preset, world, reps, cuda)
    ratios = "/".join(str(max(t.compress_ratio, 1)) for t in cfg.index_layer_types)
    lines = [f"DCP bench ({preset}, next_n {cfg.next_n}, R {ratios}): "
             f"{world} ranks, {reps} steps per batch, {mode}",
             f"{'batch':>5} {'rank':>4} | {'host p50':>8} {'p99':>7} | {'GPU p50':>7} "
             f"{'p99':>7} | {'collectives':>11} {'share':>6} {'floor':>6} | "
             f"{'1 GPU host':>10} {'GPU':>7}"]
    for b, first in enumerate(every[0]):
        spread_50, spread_99 = host_spread([ranks[b]["host"] for ranks in every])
        for r, ranks in enumerate(every):
            row = ranks[b]
            gpu, coll = _p(row["gpu"], 50), _p(row["collectives"], 50)
            share = coll / gpu if cuda and gpu > 0 else float("nan")
            lines.append(
                f"{first['batch']:>5} {r:>4} | {_p(row['host'], 50):>8.1f} "
                f"{_p(row['host'], 99):>7.1f} | {gpu:>7.1f} {_p(row['gpu'], 99):>7.1f} | "
                f"{coll:>11.1f} {share:>6.0%} {_p(row['floor'], 50):>6.1f} | "
                f"{_p(row['host_1gpu'], 50):>10.1f} "
                f"{_p(row['gpu_1gpu'], 50):>7.1f}")
            out["rows"].append({
                "batch": first["batch"], "rank": r,
                **{f"{key}_{q}": _p(row[key], q) for key in ("host", "gpu", "collectives", "floor",
                                                             "host_1gpu", "gpu_1gpu")
                   for q in (50, 99)},
                "host_min": float(np.min(row["host"])), "host_max": float(np.max(row["host"])),
            })
        lines.append(f"{'':>5} {'all':>4} | host spread across ranks per step: p50 "
                     f"{spread_50:.1f} us, p99 {spread_99:.1f} us")
        out["rows"].append({"batch": first["batch"], "rank": "spread",
                            "host_spread_50": spread_50, "host_spread_99": spread_99})
    lines.append("(microseconds; collectives = the step's all-gathers "
                 + ("replayed alone, share = of the step's GPU time" if cuda
                    else "run alone, host time") + "; floor = as many all-gathers of one "
                 "float, the same way; 1 GPU = the same step on a one-rank arena)")
    out["text"] = "\n".join(lines)
    return out
