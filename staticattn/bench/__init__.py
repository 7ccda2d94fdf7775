"""Replay-latency benchmarks: graph replay against the eager build, next to the launch floor,
and the randomized steps they (and the checks and the demo) run."""

from staticattn.bench.bench_report import BenchReport, BenchRow, Stat
from staticattn.bench.replay import run_bench

__all__ = ["BenchReport", "BenchRow", "Stat", "run_bench"]
