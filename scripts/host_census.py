"""What the host's CPUs did over a timed window, from ``/proc``: for ``rank_host_spread.py``.

A rank's host time can grow for reasons outside its own thread: another thread busy on the
sibling hardware thread of its core, the hypervisor taking the CPU (steal time), a lower
clock. ``Census.take()`` snapshots, at one instant, every CPU's tick counters
(``/proc/stat``), every thread of this process with its CPU ticks and the CPU it last ran on
(``/proc/self/task/*/stat``) and every CPU's clock (``/proc/cpuinfo``); ``window(a, b)``
turns two snapshots into shares of the wall time between them. Ticks are ``USER_HZ``
(usually 10 ms), so a window should last a second or more.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")


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
