"""Replay-latency benchmarks: graph replay against the eager build, next to the launch floor,
and the randomized steps they (and the checks and the demo) run."""

from staticattn.bench.replay import run_bench

__all__ = ["run_bench"]
