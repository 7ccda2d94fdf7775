"""Each rank's host thread on a physical core of its own, near its GPU
(``distributed.affinity``), over a sysfs tree written here: two NUMA nodes of two cores,
each core two hardware threads numbered the way x86 machines number them (CPU n and n + 4
share a core)."""

from __future__ import annotations

import os

import pytest

from staticattn.distributed.affinity import (
    host_cpu,
    parse_cpu_list,
    physical_cores,
    pin_host_thread,
)

GPU_A, GPU_B = "0000:1b:00.0", "0000:9a:00.0"
ALL = list(range(8))


@pytest.fixture
def sysfs(tmp_path):
    for cpu in ALL:
        topo = tmp_path / f"devices/system/cpu/cpu{cpu}/topology"
        topo.mkdir(parents=True)
        first = cpu % 4
        topo.joinpath("thread_siblings_list").write_text(f"{first},{first + 4}\n")
    for bus, cpus in ((GPU_A, "0-1,4-5"), (GPU_B, "2-3,6-7")):
        dev = tmp_path / f"bus/pci/devices/{bus}"
        dev.mkdir(parents=True)
        dev.joinpath("local_cpulist").write_text(cpus + "\n")
    return tmp_path


@pytest.mark.parametrize(("text", "cpus"), [
    ("0-3,8,10-11\n", [0, 1, 2, 3, 8, 10, 11]),
    ("5", [5]),
    ("\n", []),
    ("2-2,1", [1, 2]),
])
def test_a_kernel_cpu_list_reads_as_its_cpus(text, cpus):
    assert parse_cpu_list(text) == cpus


def test_hardware_threads_of_one_core_group_together(sysfs):
    assert physical_cores(ALL, sysfs) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert physical_cores([5, 1, 2], sysfs) == [[1, 5], [2]]


def test_without_sysfs_each_cpu_is_a_core(tmp_path):
    assert physical_cores([3, 1], tmp_path) == [[1], [3]]


@pytest.mark.parametrize(("rank", "bus", "cpu"), [
    (0, GPU_A, 1),     # node A's second core: its first is left to the system
    (1, GPU_B, 2),     # node B: cores (2, 6) and (3, 7); rank 1 wraps to the first
    (0, GPU_B, 3),
    (1, GPU_A, 0),
])
def test_a_rank_takes_a_core_on_its_gpus_node(sysfs, rank, bus, cpu):
    assert host_cpu(rank, bus, ALL, sysfs) == cpu


def test_ranks_sharing_a_node_take_distinct_physical_cores(sysfs):
    """Without a GPU's node (or one sysfs does not know) every allowed CPU is near; four
    ranks get the four cores, never two hardware threads of one."""
    for bus in (None, "0000:00:00.0"):
        cpus = [host_cpu(r, bus, ALL, sysfs) for r in range(4)]
        assert cpus == [1, 2, 3, 0]


def test_only_allowed_cpus_are_chosen(sysfs):
    assert host_cpu(0, GPU_A, [0, 4, 2], sysfs) == 0  # node A allows one core only
    assert host_cpu(0, GPU_A, [2, 3], sysfs) == 3     # node A allows none: any allowed one
    assert host_cpu(0, GPU_A, [6], sysfs) is None     # nothing to choose between


def test_pinning_moves_the_calling_thread_only_to_the_chosen_cpu():
    before = os.sched_getaffinity(0)
    try:
        cpu = pin_host_thread(0)
        if len(before) < 2:
            assert cpu is None and os.sched_getaffinity(0) == before
        else:
            assert cpu in before and os.sched_getaffinity(0) == {cpu}
    finally:
        os.sched_setaffinity(0, before)
