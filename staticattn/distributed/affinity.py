"""A core of its own for each rank's host thread, on its GPU's NUMA node.

A rank's host path between two replays (the step's checks, the staging, the graph launch) is
tens of microseconds of Python and numpy. Left to the scheduler, two ranks' threads can share
one physical core (each on a hardware thread of it), sit on the node away from their GPU, or
move between cores, and one rank's host path then runs up to twice as long as the other's:
the ranks' host spread, which a collective waits out, grows with it. Pinning each rank's
thread to a physical core of its own, on its GPU's node, is what latency-bound inference
servers do; :func:`pin_host_thread` does it from the machine's sysfs topology and says which
CPU it chose.

Only the calling thread is pinned (``sched_setaffinity`` of thread 0): the threads NCCL and
gloo started before it keep theirs. Pin after the communicators exist -- NCCL derives its
proxy threads' CPUs from the creating thread's affinity.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["host_cpu", "parse_cpu_list", "physical_cores", "pin_host_thread"]

SYSFS = Path("/sys")


def parse_cpu_list(text: str) -> list[int]:
    """The CPUs of a kernel CPU list such as ``"0-3,8,10-11"``, ascending; ``[]`` for an
    empty one."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return sorted(cpus)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def physical_cores(cpus: list[int], sysfs: Path = SYSFS) -> list[list[int]]:
    """``cpus`` grouped by physical core (hardware threads that share one), in the order of
    each core's first CPU; a CPU whose siblings sysfs does not give is a core of its own."""
    cores: dict[tuple[int, ...], list[int]] = {}
    for cpu in sorted(cpus):
        text = _read(sysfs / f"devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        siblings = tuple(parse_cpu_list(text)) if text else (cpu,)
        cores.setdefault(siblings, []).append(cpu)
    return sorted(cores.values(), key=lambda core: core[0])


def _gpu_cpus(pci_bus: str | None, allowed: list[int], sysfs: Path) -> list[int]:
    """The allowed CPUs on the GPU's NUMA node; all allowed ones when sysfs does not say or
    the node holds none of them."""
    if pci_bus is None:
        return allowed
    text = _read(sysfs / f"bus/pci/devices/{pci_bus.lower()}/local_cpulist")
    near = [c for c in parse_cpu_list(text) if c in set(allowed)] if text else []
    return near or allowed


def host_cpu(local_rank: int, pci_bus: str | None, allowed: list[int],
             sysfs: Path = SYSFS) -> int | None:
    """The CPU for local rank ``local_rank``'s host thread: the first hardware thread of
    physical core ``(local_rank + 1) % cores`` on its GPU's node (``pci_bus``,
    ``"0000:1b:00.0"``), among ``allowed``. Ranks sharing a node get distinct cores while it
    has as many as they are, and the node's first core, where the system's interrupts and
    daemons tend to run, is the last one handed out. None when fewer than two CPUs are
    allowed."""
    if len(allowed) < 2:
        return None
    cores = physical_cores(_gpu_cpus(pci_bus, sorted(allowed), sysfs), sysfs)
    return cores[(local_rank + 1) % len(cores)][0]


def _pci_bus(device: int) -> str | None:
    import torch

    try:
        p = torch.cuda.get_device_properties(device)
        return f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
    except (AttributeError, RuntimeError):
        return None


def pin_host_thread(local_rank: int, device: int | None = None) -> int | None:
    """Pin the calling thread to :func:`host_cpu`'s choice for ``local_rank`` (its GPU
    ``device``, CUDA index, or none); the CPU, or None when there was nothing to choose."""
    cpu = host_cpu(local_rank, None if device is None else _pci_bus(device),
                   sorted(os.sched_getaffinity(0)))
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    return cpu
