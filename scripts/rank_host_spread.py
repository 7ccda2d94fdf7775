"""Where the ranks' host spread comes from, step by step.

    torchrun --nproc-per-node 2 scripts/rank_host_spread.py [--preset deepseek-v4]
             [--requests 8 16] [--reps 1000] [--json spread.json]

``bench --dcp`` reports the ranks' host spread: per step, the slowest rank's host time less
the fastest's. This script times the same replayed DCP step (after the same untimed
rendezvous) and records, on each rank's thread and around each step:

* ``wall_us``: the host time, as the bench takes it;
* ``cpu_us``: the thread's CPU time over the same window (``CLOCK_THREAD_CPUTIME_ID``).
  ``wall_us - cpu_us`` is time the thread did not run: switched out, or its CPU taken by
  the hypervisor where the guest accounts steal time apart;
* ``switches``: its voluntary and involuntary context switches (``getrusage``);
* ``gc``: Python collections started during the step;
* ``cpu_before`` / ``cpu_after``: the CPU it ran on (``sched_getcpu``);
* ``probe_us``: right after the step, a fixed piece of pure-Python work
  (``host_census.probe``), the same on every rank: when it too runs slower on one rank,
  that rank's CPU executes the same code slower, whatever the step does. The steps where
  every rank's probe ran at full speed get a spread of their own.

Around each request count's timed steps, ``host_census`` takes what the host's CPUs did:
per CPU its busy and steal shares and its clock, and this process's busy threads.

Rank 0 prints, per request count, the spread of the wall times and the spread of the CPU
times: when the two are alike the spread was spent executing (a slower CPU, a busy sibling
hardware thread), not waiting; and how many steps some rank was switched out, collected
garbage, changed CPU or shared a physical core with another rank (sysfs topology). Then per
rank: the probe's time, its CPU's busy and steal shares and clock, the busiest other
hardware thread of its core, and the process's threads that ran 5% of the time or more.
With ``--json`` it writes every rank's records. On CPU the ranks join over gloo and run the step
eagerly: the records are real, the figures say nothing of a GPU host.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import gc
import json
import os
import resource
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from host_census import SLOW, Census, probe, window

from staticattn.distributed.dcp_bench import WARMUP, aligner, host_spread
from staticattn.distributed.paired import paired_managers
from staticattn.distributed.world import (
    dcp_config,
    graph_pool_blocks,
    join,
    leave,
    random_decode_step,
)
from staticattn.graphs import GraphOptions

FIELDS = ("wall_us", "cpu_us", "switches", "gc", "cpu_before", "cpu_after", "probe_us")


class StepClock:
    """Times calls on the calling thread; one record (``FIELDS``) a call."""

    def __init__(self) -> None:
        self._collections = 0
        gc.callbacks.append(self._count)
        libc = ctypes.CDLL(None, use_errno=True)
        self._getcpu = getattr(libc, "sched_getcpu", lambda: -1)
        self.probe = probe

    def _count(self, phase: str, info: dict) -> None:
        self._collections += phase == "start"

    def close(self) -> None:
        gc.callbacks.remove(self._count)

    def time(self, fn) -> tuple:
        """Run ``fn()``; its record."""
        cpu0, gc0 = self._getcpu(), self._collections
        use0 = resource.getrusage(resource.RUSAGE_THREAD)
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        fn()
        t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
        use1 = resource.getrusage(resource.RUSAGE_THREAD)
        switches = (use1.ru_nvcsw - use0.ru_nvcsw) + (use1.ru_nivcsw - use0.ru_nivcsw)
        cpu1 = self._getcpu()
        p0 = time.perf_counter_ns()
        self.probe()
        p1 = time.perf_counter_ns()
        return ((t1 - t0) / 1e3, (c1 - c0) / 1e3, switches, self._collections - gc0, cpu0,
                cpu1, (p1 - p0) / 1e3)


def core_of(cpus, sysfs: Path = Path("/sys")) -> dict[int, tuple[int, ...]]:
    """Each CPU's physical core: the hardware threads sysfs lists as its siblings (the CPU
    alone when sysfs does not say)."""
    cores = {}
    for cpu in cpus:
        path = sysfs / f"devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
        try:
            text = path.read_text().strip()
        except OSError:
            cores[cpu] = (cpu,)
            continue
        members = []
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            members.extend(range(int(lo), int(hi or lo) + 1))
        cores[cpu] = tuple(members)
    return cores


def summarize(records: np.ndarray) -> dict:
    """``records`` ``(world, reps, len(FIELDS))``: the spreads and the step counts.

    ``full_speed_*``: the steps where every rank's probe ran within ``SLOW`` of the run's
    fast probe (its 5th percentile over every rank and step), so that no rank's CPU was in a
    slow phase, and the wall-time spread over those steps alone (None without any)."""
    wall, cpu, probed = records[..., 0], records[..., 1], records[..., 6]
    placed = records[..., 4].astype(int)
    cores = core_of(sorted(set(placed.ravel().tolist()) - {-1}))
    # Two ranks on one physical core in a step; a CPU of -1 (no sched_getcpu) says nothing.
    shared = np.array([len({cores[c] for c in step if c >= 0}) < (step >= 0).sum()
                       for step in placed.T])

    def p(v, q):
        return round(float(np.percentile(v, q)), 1)

    # The bench's own spread (dcp_bench.host_spread), of the wall and of the CPU times.
    spread, cpu_spread = (tuple(round(x, 1) for x in host_spread(t)) for t in (wall, cpu))
    full = (probed < SLOW * np.percentile(probed, 5)).all(axis=0)
    full_spread = (tuple(round(x, 1) for x in host_spread(wall[:, full])) if full.any()
                   else (None, None))

    return {
        "host_p50": [p(w, 50) for w in wall], "host_p99": [p(w, 99) for w in wall],
        "off_cpu_p50": [p(w - c, 50) for w, c in zip(wall, cpu)],
        "off_cpu_p99": [p(w - c, 99) for w, c in zip(wall, cpu)],
        "spread_p50": spread[0], "spread_p99": spread[1],
        "cpu_spread_p50": cpu_spread[0], "cpu_spread_p99": cpu_spread[1],
        "steps_switched": int((records[..., 2] > 0).any(axis=0).sum()),
        "steps_collecting": int((records[..., 3] > 0).any(axis=0).sum()),
        "steps_moved": int((records[..., 4] != records[..., 5]).any(axis=0).sum()),
        "steps_sharing_a_core": int(shared.sum()),
        "cpus": [sorted(set(r.tolist())) for r in placed],
        "probe_p50": [p(r, 50) for r in probed],
        "full_speed_steps": int(full.sum()),
        "full_speed_spread_p50": full_spread[0], "full_speed_spread_p99": full_spread[1],
    }


def rank_cpus(windows: list[dict], records: np.ndarray) -> list[dict]:
    """Per rank, from its ``host_census.window`` and its records: its thread's CPU (the one it
    started most steps on), that CPU's busy and steal shares and clock (MHz, None where
    unknown), the busiest other hardware thread of its core, and its process's busy threads.
    """
    out = []
    for w, placed in zip(windows, records[..., 4].astype(int)):
        cpu = int(np.bincount(placed[placed >= 0]).argmax()) if (placed >= 0).any() else -1
        own = w["cpus"].get(cpu, {"busy": None, "steal": None})
        siblings = [c for c in core_of([cpu])[cpu] if c != cpu and c in w["cpus"]]
        out.append({"cpu": cpu, "busy": own["busy"], "steal": own["steal"],
                    "mhz": w["mhz"].get(cpu),
                    "sibling_busy": max((w["cpus"][c]["busy"] for c in siblings),
                                        default=None),
                    "threads": w["threads"]})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="deepseek-v4")
    parser.add_argument("--requests", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--reps", type=int, default=1000)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world < 2:
        print("start it with torchrun --nproc-per-node WORLD scripts/rank_host_spread.py "
              "(WORLD >= 2)")
        return 2
    me = join(world, "bench")
    cfg = dcp_config(args.preset, me.world, me.rank, me.device)
    options = GraphOptions(progress=False, num_kv_blocks=graph_pool_blocks(cfg))
    rng = np.random.default_rng(0)  # one seed: every rank times the same steps
    align = aligner(me.cuda, me.check_group)
    clock = StepClock()
    mine = {}
    with paired_managers(me, cfg, args.preset, options) as pair:
        if me.cuda:
            pair.rank.capture([k * cfg.next_n for k in args.requests], buckets=())
        for k in args.requests:
            step = functools.partial(
                pair.rank.run, *pair.write(random_decode_step(cfg, rng, num_reqs=k)))
            for _ in range(WARMUP):
                step()
            steps, before = [], Census.take()
            for _ in range(args.reps):
                align()
                steps.append(clock.time(step))
            mine[k] = (steps, window(before, Census.take()))
    clock.close()
    every = [None] * me.world
    dist.all_gather_object(every, mine, group=me.check_group)
    leave(me)
    if me.rank:
        return 0
    report = {"preset": args.preset, "world": me.world, "reps": args.reps,
              "device": torch.cuda.get_device_name() if me.cuda else "cpu", "fields": FIELDS,
              "requests": {}}
    for k in args.requests:
        records = np.array([ranks[k][0] for ranks in every], dtype=np.float64)
        windows = [ranks[k][1] for ranks in every]
        summary = summarize(records)
        placed = rank_cpus(windows, records)
        report["requests"][k] = {"summary": summary, "ranks": placed, "windows": windows,
                                 "records": records.tolist()}
        print(f"{k} requests: host p50 {summary['host_p50']} p99 {summary['host_p99']} us; "
              f"spread p50 {summary['spread_p50']} p99 {summary['spread_p99']}; CPU-time "
              f"spread p50 {summary['cpu_spread_p50']} p99 {summary['cpu_spread_p99']}; "
              f"off-CPU p99 {summary['off_cpu_p99']}")
        print(f"   steps with a switch {summary['steps_switched']}, a collection "
              f"{summary['steps_collecting']}, a CPU change {summary['steps_moved']}, two "
              f"ranks on one core {summary['steps_sharing_a_core']} (of {args.reps}); "
              f"CPUs per rank {summary['cpus']}")
        print(f"   every rank's probe within {SLOW}x of the fast one: "
              f"{summary['full_speed_steps']} steps, spread p50 "
              f"{summary['full_speed_spread_p50']} p99 {summary['full_speed_spread_p99']}")
        for r, (p50, cpu) in enumerate(zip(summary["probe_p50"], placed)):
            print(f"   rank {r}: probe p50 {p50} us; CPU {cpu['cpu']} busy {cpu['busy']} "
                  f"steal {cpu['steal']} at {cpu['mhz']} MHz, its core's other thread busy "
                  f"{cpu['sibling_busy']}; threads >= 5%: {cpu['threads']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
