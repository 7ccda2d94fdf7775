"""``scripts/host_census.py``: it reads ``/proc`` as the kernel writes it, and turns two
snapshots into the shares of the time between them."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest
from helpers.paths import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import host_census as census  # noqa: E402

STAT = """cpu  100 0 50 1000 0 0 0 0 0 0
cpu0 10 1 5 500 2 1 1 7 0 0
cpu1 90 0 45 500 0 0 0 0 0 0
intr 123
"""
CPUINFO = """processor\t: 0
model name\t: Some CPU
cpu MHz\t\t: 2400.125

processor\t: 1
cpu MHz\t\t: 3100.5
"""


def fake_proc(tmp_path, threads):
    (tmp_path / "stat").write_text(STAT)
    (tmp_path / "cpuinfo").write_text(CPUINFO)
    for tid, (name, utime, stime, cpu) in threads.items():
        task = tmp_path / "self" / "task" / str(tid)
        task.mkdir(parents=True)
        # fields 3..39: state, then 10 fields, utime (14), stime (15), 23 more, processor (39)
        rest = ["S"] + ["0"] * 10 + [str(utime), str(stime)] + ["0"] * 23 + [str(cpu), "0"]
        (task / "stat").write_text(f"{tid} ({name}) " + " ".join(rest) + "\n")
    return tmp_path


def test_cpu_ticks_sum_busy_columns_and_read_steal(tmp_path):
    ticks = census.cpu_ticks(fake_proc(tmp_path, {}))
    assert ticks == {0: (10 + 1 + 5 + 1 + 1, 7), 1: (135, 0)}  # the "cpu" total is left out


def test_thread_ticks_read_names_with_spaces_and_parentheses(tmp_path):
    proc = fake_proc(tmp_path, {7: ("pt main (x)", 30, 12, 5), 8: ("cuda-EvtHandlr", 1, 0, 9)})
    assert census.thread_ticks(proc) == {7: ("pt main (x)", 42, 5), 8: ("cuda-EvtHandlr", 1, 9)}


def test_cpu_mhz_per_processor(tmp_path):
    assert census.cpu_mhz(fake_proc(tmp_path, {})) == {0: 2400.125, 1: 3100.5}


def test_the_window_gives_shares_of_the_wall_time_and_the_busy_threads():
    a = census.Census(0.0, {0: (0, 0), 1: (50, 0)}, {7: ("main", 10, 0), 8: ("idle", 5, 1)})
    b = census.Census(2.0, {0: (180, 10), 1: (60, 0)},
                      {7: ("main", 200, 0), 8: ("idle", 6, 1), 9: ("new", 40, 3)}, {0: 2000.0})
    w = census.window(a, b, hz=100)  # 200 ticks in the window
    assert w["cpus"] == {0: {"busy": 0.9, "steal": 0.05}, 1: {"busy": 0.05, "steal": 0.0}}
    assert w["threads"] == [["main", 0.95, 0], ["new", 0.2, 3]]  # "idle" ran 0.5%
    assert w["mhz"] == {0: 2000.0}


def test_a_busy_thread_of_this_process_shows_in_a_real_census():
    if not os.path.exists("/proc/self/task"):
        pytest.skip("no /proc")
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    t = threading.Thread(target=spin, name="spinner")
    before = census.Census.take()
    t.start()
    time.sleep(0.6)
    after = census.Census.take()  # while the spinner lives: an ended thread leaves /proc
    stop.set()
    t.join()
    w = census.window(before, after)
    assert w["cpus"] and all(0 <= s["busy"] <= 1.05 for s in w["cpus"].values())
    # Python threads share the GIL with this one, sleeping here: the spinner ran most of it.
    assert any(share >= 0.3 for _, share, _ in w["threads"])


def test_the_probe_does_fixed_work():
    assert census.probe(8) == 28 and census.probe(16) == 56  # 0 + 1 + ... + 7, twice


def test_phases_count_blocks_slower_than_the_fastest():
    ph = census.phases([10.0, 12.0, 14.0, 30.0])
    assert ph == {"fastest": 10.0, "median": 13.0, "slowest": 30.0, "slow_share": 0.5}


def test_probe_blocks_pin_and_time_every_block(monkeypatch):
    pinned = []
    monkeypatch.setattr(census.os, "sched_setaffinity", lambda pid, cpus: pinned.append(cpus))
    blocks = census.probe_blocks(0.35, cpu=0)
    # Pinned for the probe, then the caller's CPUs again; whole 100 ms blocks only.
    assert pinned == [{0}, os.sched_getaffinity(0)] and len(blocks) == 3
    assert all(0 < b < 10_000 for b in blocks)


def test_the_control_runs_one_pinned_process_per_cpu(capsys):
    cpu = min(os.sched_getaffinity(0))
    assert census.main(["--seconds", "0.3", "--cpus", str(cpu)]) == 0
    out = capsys.readouterr().out
    assert f"CPU   {cpu}: fastest" in out and "0.3 s on each of 1 CPUs" in out
    assert "CPUs had a block 1.3x slower" in out


def test_siblings_are_the_cpus_whose_busy_loop_slows_the_probe(monkeypatch, capsys):
    # A fake probe_blocks: the probe runs 2x slower while a spinner lives on CPU 5.
    spinning = []

    class FakeProcess:
        def __init__(self, target, args):
            self.cpu, self.started = args[0], args[1]

        def start(self):
            spinning.append(self.cpu)
            self.started.set()

        def join(self):
            spinning.remove(self.cpu)

    spawn = census.multiprocessing.get_context("spawn")
    monkeypatch.setattr(spawn, "Process", FakeProcess)
    monkeypatch.setattr(census.multiprocessing, "get_context", lambda _: spawn)
    monkeypatch.setattr(census, "probe_blocks",
                        lambda seconds, cpu: [20.0 if 5 in spinning else 10.0])
    assert census.slowed_by(1, others=[2, 5, 7]) == {2: 1.0, 5: 2.0, 7: 1.0}
    monkeypatch.setattr(census.os, "sched_getaffinity", lambda pid: {1, 5, 7})
    assert census.main(["--siblings-of", "1"]) == 0
    assert "CPU 1: slowed >= 1.3x by a busy CPU [5]" in capsys.readouterr().out


def test_a_spinner_that_never_starts_is_an_error_not_a_ratio(monkeypatch):
    class SilentProcess:  # never sets "started"
        def __init__(self, target, args):
            pass

        def start(self):
            pass

        def join(self):
            pass

    spawn = census.multiprocessing.get_context("spawn")
    monkeypatch.setattr(spawn, "Process", SilentProcess)
    monkeypatch.setattr(census.multiprocessing, "get_context", lambda _: spawn)
    monkeypatch.setattr(census, "probe_blocks", lambda seconds, cpu: [10.0])
    monkeypatch.setattr(census, "SPIN_START_S", 0.05)
    with pytest.raises(RuntimeError, match="busy loop for CPU 3 did not start"):
        census.slowed_by(1, others=[3])


def test_a_real_spinner_runs_pinned_and_stops():
    cpu = min(os.sched_getaffinity(0))
    allowed = os.sched_getaffinity(0)
    ratios = census.slowed_by(cpu, seconds=0.2, others=[cpu])  # the spinner on the same CPU
    assert ratios[cpu] > 0 and os.sched_getaffinity(0) == allowed
