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
    stop.set()
    t.join()
    w = census.window(before, census.Census.take())
    assert w["cpus"] and all(0 <= s["busy"] <= 1.05 for s in w["cpus"].values())
    # Python threads share the GIL with this one, sleeping here: the spinner ran most of it.
    assert any(share >= 0.3 for _, share, _ in w["threads"])
