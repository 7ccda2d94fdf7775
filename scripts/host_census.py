"""What the host's CPUs did over a timed window, from ``/proc``, and how fast they ran.

    python scripts/host_census.py [--seconds 10] [--cpus 0 1 ...]
    python scripts/host_census.py --siblings-of CPU [CPU ...]

A rank's host time can grow for reasons outside its own thread: another thread busy on the
sibling hardware thread of its core, the hypervisor taking the CPU (steal time), a lower
clock. ``Census.take()`` snapshots, at one instant, every CPU's tick counters
(``/proc/stat``), every thread of this process with its CPU ticks and the CPU it last ran on
(``/proc/self/task/*/stat``) and every CPU's clock (``/proc/cpuinfo``); ``window(a, b)``
turns two snapshots into shares of the wall time between them. Ticks are ``USER_HZ``
(usually 10 ms), so a window should last a second or more. ``rank_host_spread.py`` takes one
around each timed run of steps.

``probe`` is a fixed piece of pure-Python work. Run as a script, this module is the control
that needs neither torch nor a GPU: one process per CPU named (each pinned to it) times the
probe back to back for ``--seconds``, and it prints, per CPU, the probe's median over each
100 ms block: its fastest block, its slowest, and the share of blocks at least 1.3x slower
than its fastest. Phases where a CPU runs the same bytecode slower show there, with no
rank, step or collective involved. ``--siblings-of`` looks for the CPUs that share a
physical core with one where the guest cannot see it (a virtual machine's topology may
list one thread per core): the probe's median on that CPU alone, then beside a busy loop
pinned to each other CPU in turn; a CPU that slows it by ``SLOW`` or more shares its core.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")
PROBE_ITERATIONS = 400  # 10-25 us of bytecode on a server core
BLOCK_S = 0.1
SLOW = 1.3  # a block this much slower than the CPU's fastest counts as slow
SPIN_START_S = 30.0


def probe(n: int = PROBE_ITERATIONS) -> int:
    """Fixed pure-Python work: a loop of additions and masks, no allocation, no I/O."""
    total = 0
    for i in range(n):
        total += i & 7
    return total


def cpu_ticks(proc: Path = PROC) -> dict[int, tuple[int, int]]:
    """Per CPU, its ``(busy, steal)`` ticks since boot: busy is user + nice + system + irq +
    softirq; steal is the time the hypervisor ran something else on it."""
    ticks = {}
    for line in (proc / "stat").read_text().splitlines():
        name, *values = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        v = [int(x) for x in values] + [0] * 8  # older kernels list fewer columns
        user, nice, system, _idle, _iowait, irq, softirq, steal = v[:8]
        ticks[int(name[3:])] = (user + nice + system + irq + softirq, steal)
    return ticks


def thread_ticks(proc: Path = PROC) -> dict[int, tuple[str, int, int]]:
    """Per thread of this process: ``(name, user + system ticks, CPU it last ran on)``."""
    threads = {}
    for task in (proc / "self" / "task").iterdir():
        try:
            text = (task / "stat").read_text()
        except OSError:  # the thread ended between the listing and the read
            continue
        # "tid (name) state ...": the name may hold spaces and parentheses.
        name = text[text.index("(") + 1:text.rindex(")")]
        rest = text[text.rindex(")") + 2:].split()
        # rest[0] is field 3 (state): utime, stime and processor are fields 14, 15 and 39.
        threads[int(task.name)] = (name, int(rest[11]) + int(rest[12]), int(rest[36]))
    return threads


def cpu_mhz(proc: Path = PROC) -> dict[int, float]:
    """Per CPU, its clock as ``/proc/cpuinfo`` gives it (MHz; empty where it does not)."""
    mhz, cpu = {}, None
    for line in (proc / "cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "processor":
            cpu = int(value)
        elif key == "cpu MHz" and cpu is not None:
            mhz[cpu] = float(value)
    return mhz


@dataclass
class Census:
    """One instant's counters (see the module docstring)."""

    wall: float
    cpus: dict[int, tuple[int, int]]
    threads: dict[int, tuple[str, int, int]]
    mhz: dict[int, float] = field(default_factory=dict)

    @classmethod
    def take(cls, proc: Path = PROC) -> Census:
        return cls(time.perf_counter(), cpu_ticks(proc), thread_ticks(proc), cpu_mhz(proc))


def window(a: Census, b: Census, busy_share: float = 0.05,
           hz: int | None = None) -> dict:
    """Shares of the wall time from ``a`` to ``b``: per CPU, ``busy`` and ``steal``; the threads
    of this process that ran at least ``busy_share`` of it, as ``[name, share, last CPU]``,
    busiest first; and each CPU's clock at ``b`` (MHz)."""
    hz = hz or os.sysconf("SC_CLK_TCK")
    span = max(b.wall - a.wall, 1e-9) * hz

    def share(ticks: int) -> float:
        return round(ticks / span, 3)

    cpus = {c: {"busy": share(b.cpus[c][0] - a.cpus[c][0]),
                "steal": share(b.cpus[c][1] - a.cpus[c][1])} for c in b.cpus if c in a.cpus}
    threads = []
    for tid, (name, ticks, cpu) in b.threads.items():
        ran = share(ticks - a.threads.get(tid, (name, 0, cpu))[1])
        if ran >= busy_share:
            threads.append([name, ran, cpu])
    threads.sort(key=lambda t: -t[1])
    return {"cpus": cpus, "threads": threads, "mhz": dict(b.mhz)}


def probe_blocks(seconds: float, cpu: int | None = None) -> list[float]:
    """Time ``probe`` back to back for ``seconds`` on ``cpu`` (pinned; None: where the
    scheduler puts it): its median µs over each ``BLOCK_S`` block."""
    allowed = os.sched_getaffinity(0)
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    blocks, times = [], []
    start = block_end = time.perf_counter()
    block_end += BLOCK_S
    try:
        while block_end <= start + seconds:
            t0 = time.perf_counter_ns()
            probe()
            times.append((time.perf_counter_ns() - t0) / 1e3)
            if time.perf_counter() >= block_end:
                blocks.append(statistics.median(times))
                times, block_end = [], block_end + BLOCK_S
    finally:
        os.sched_setaffinity(0, allowed)  # the caller's CPUs again
    return blocks


def phases(blocks: list[float]) -> dict:
    """A CPU's block medians summed up: fastest, median and slowest block (µs), and the share
    of blocks ``SLOW`` times slower than its fastest."""
    low = min(blocks)
    return {"fastest": round(low, 1), "median": round(statistics.median(blocks), 1),
            "slowest": round(max(blocks), 1),
            "slow_share": round(sum(b >= SLOW * low for b in blocks) / len(blocks), 3)}


def _spin(cpu: int, started, stop) -> None:
    os.sched_setaffinity(0, {cpu})
    started.set()
    while not stop.is_set():
        pass


def slowed_by(cpu: int, seconds: float = 0.5, others=None) -> dict[int, float]:
    """The probe's median on ``cpu`` beside a busy loop on each other CPU (``others``, default
    every CPU this process may run on), over its median alone: a ratio per other CPU."""
    # Spawned, not forked: a caller with threads (CUDA's, a test runner's) forks safely only
    # when no other thread holds a lock at that instant.
    spawn = multiprocessing.get_context("spawn")
    others = others or sorted(os.sched_getaffinity(0) - {cpu})
    alone = statistics.median(probe_blocks(seconds, cpu))
    ratios = {}
    for other in others:
        started, stop = spawn.Event(), spawn.Event()
        spinner = spawn.Process(target=_spin, args=(other, started, stop))
        spinner.start()
        try:
            # A spawned interpreter takes a while to start; without its busy loop the ratio
            # would say nothing of the other CPU.
            if not started.wait(timeout=SPIN_START_S):
                raise RuntimeError(f"the busy loop for CPU {other} did not start within "
                                   f"{SPIN_START_S} s")
            ratios[other] = round(statistics.median(probe_blocks(seconds, cpu)) / alone, 2)
        finally:
            stop.set()
            spinner.join()
    return ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--cpus", type=int, nargs="+", default=None,
                        help="one process pinned to each (default: every CPU this process "
                             "may run on)")
    parser.add_argument("--siblings-of", type=int, nargs="+", default=None)
    args = parser.parse_args(argv)
    if args.siblings_of:
        for cpu in args.siblings_of:
            ratios = slowed_by(cpu)
            worst = sorted(ratios.items(), key=lambda r: -r[1])[:3]
            near = [c for c, r in ratios.items() if r >= SLOW]
            print(f"CPU {cpu}: slowed >= {SLOW}x by a busy CPU {near or 'none'}; the three "
                  f"worst (CPU, ratio): {worst}")
        return 0
    cpus = args.cpus or sorted(os.sched_getaffinity(0))
    before = Census.take()
    with multiprocessing.get_context("spawn").Pool(len(cpus)) as pool:
        runs = pool.starmap(probe_blocks, [(args.seconds, c) for c in cpus])
    shares = window(before, Census.take())["cpus"]
    print(f"probe of {PROBE_ITERATIONS} iterations, median us per {BLOCK_S * 1e3:.0f} ms block, "
          f"{args.seconds:g} s on each of {len(cpus)} CPUs at once")
    slow = 0
    for cpu, blocks in zip(cpus, runs):
        ph = phases(blocks)
        slow += ph["slow_share"] > 0
        steal = shares.get(cpu, {}).get("steal")
        print(f"  CPU {cpu:3d}: fastest {ph['fastest']:6.1f}  median {ph['median']:6.1f}  "
              f"slowest {ph['slowest']:6.1f}  blocks >= {SLOW}x fastest: "
              f"{ph['slow_share']:6.1%}  steal {steal}")
    print(f"{slow} of {len(cpus)} CPUs had a block {SLOW}x slower than their fastest")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
