"""Replay-latency benchmark: per captured size, one graph replay vs the same builders
(and step) run eagerly, plus a one-kernel graph as the floor.

For each size ``s`` (tokens; ``s / next_n`` requests, all real, long random sequences):

* host time of one step: wall clock of ``GraphManager.run`` (validation, staging and
  ``replay()``), measured after a device sync so no wait on earlier work is counted;
* GPU time of one step: CUDA events around the replay;
* the same for the eager path (``run(..., eager=True)``: the same validation and staging,
  then every builder's ``build`` and the step, launched one kernel at a time);
* node census of the graph; median, min and max over ``reps`` steps.

Absolute numbers are only meaningful from a GPU: the report states device, driver, CUDA,
torch and triton versions.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from staticattn.arena import ArenaConfig
from staticattn.builders.base import make_arena
from staticattn.graphs.capture import capture, warm_up
from staticattn.graphs.manager import GraphManager
from staticattn.graphs.random_batches import random_uniform_decode

__all__ = [
    "BenchRow", "BenchReport", "run_bench", "environment", "one_kernel_replay_us",
    "replay_gpu_us",
]


@dataclass(slots=True)
class Stat:
    median: float
    min: float
    max: float

    @classmethod
    def of(cls, xs: Sequence[float]) -> Stat:
        return cls(statistics.median(xs), min(xs), max(xs))


@dataclass(slots=True)
class BenchRow:
    size: int
    num_reqs: int
    kernels: int | None
    nodes: int | None
    graph_host_us: Stat
    graph_gpu_us: Stat
    eager_host_us: Stat
    eager_gpu_us: Stat

    @property
    def host_ratio(self) -> float:
        return self.eager_host_us.median / self.graph_host_us.median

    @property
    def gpu_ratio(self) -> float:
        return self.eager_gpu_us.median / self.graph_gpu_us.median


@dataclass(slots=True)
class BenchReport:
    env: dict
    preset: str
    next_n: int
    consumer: str
    one_kernel_graph_gpu_us: Stat | None
    rows: list[BenchRow] = field(default_factory=list)

    def table(self) -> str:
        head = (f"{'size':>5} {'reqs':>5} {'kern':>5} | {'graph host us':>14} "
                f"{'graph GPU us':>13} | {'eager host us':>14} {'eager GPU us':>13} | "
                f"{'host x':>7} {'GPU x':>6}")
        lines = [head, "-" * len(head)]
        for r in self.rows:
            lines.append(
                f"{r.size:>5} {r.num_reqs:>5} {r.kernels if r.kernels is not None else '-':>5} | "
                f"{r.graph_host_us.median:>14.1f} {r.graph_gpu_us.median:>13.1f} | "
                f"{r.eager_host_us.median:>14.1f} {r.eager_gpu_us.median:>13.1f} | "
                f"{r.host_ratio:>7.1f} {r.gpu_ratio:>6.1f}"
            )
        if self.one_kernel_graph_gpu_us is not None:
            floor = self.one_kernel_graph_gpu_us
            lines.append(f"one-kernel graph replay, GPU: {floor.median:.1f} us "
                         f"(min {floor.min:.1f}, max {floor.max:.1f})")
        return "\n".join(lines)

    def header(self) -> str:
        e = self.env
        return (f"device {e['device']} | driver {e['driver']} | CUDA {e['cuda']} | torch "
                f"{e['torch']} | triton {e['triton']} | preset {self.preset}, next_n "
                f"{self.next_n}, step: {self.consumer}")

    def to_json(self) -> str:
        d = asdict(self)
        for row, r in zip(d["rows"], self.rows):
            row["host_ratio"], row["gpu_ratio"] = r.host_ratio, r.gpu_ratio
        return json.dumps(d, indent=2)

    def plot(self, path: str) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        sizes = [r.size for r in self.rows]
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for ax, kind in zip(axes, ("host", "gpu")):
            for path_name, style in (("graph", "o-"), ("eager", "s--")):
                st = [getattr(r, f"{path_name}_{kind}_us") for r in self.rows]
                med = [s.median for s in st]
                ax.plot(sizes, med, style, label=f"{path_name} replay" if path_name == "graph"
                        else "eager build")
                ax.fill_between(sizes, [s.min for s in st], [s.max for s in st], alpha=0.15)
            if kind == "gpu" and self.one_kernel_graph_gpu_us is not None:
                ax.axhline(self.one_kernel_graph_gpu_us.median, color="gray", ls=":",
                           label="one-kernel graph")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("batch size (tokens)")
            ax.set_ylabel(f"{'host submit' if kind == 'host' else 'GPU'} time per step (us)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
        fig.suptitle(self.header(), fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)


def environment() -> dict:
    """Device, driver, CUDA, torch and triton versions, as the report's header states them."""
    import triton

    env = {"torch": torch.__version__, "triton": triton.__version__,
           "python": platform.python_version(), "cuda": torch.version.cuda or "-",
           "device": "cpu", "driver": "-"}
    if torch.cuda.is_available():
        env["device"] = torch.cuda.get_device_name()
        try:
            import subprocess

            env["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10,
            ).stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            pass
    return env


def _timed_runs(gm: GraphManager, args, eager: bool, reps: int) -> tuple[list, list]:
    """Per step: host wall time of ``GraphManager.run`` (validation, staging and launch, us)
    and the GPU time of what it launched (CUDA events around the replay or the eager
    kernels, us). Each step starts on an idle device, so neither includes waiting for
    earlier work; host times are taken in a pass without the timing events."""
    host, gpu = [], []
    gm.time_gpu = False
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        gm.run(*args, eager=eager)
        host.append((time.perf_counter() - t0) * 1e6)
    gm.time_gpu = True
    for _ in range(reps):
        torch.cuda.synchronize()
        gpu.append(gm.run(*args, eager=eager).gpu_us())
    return host, gpu


def one_kernel_replay_us(reps: int = 500) -> Stat:
    """GPU time of replaying a graph of one small kernel: the floor of any replay."""
    x = torch.zeros(1024, dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    warm_up(lambda: x.add_(1), stream)
    g, _ = capture(lambda: x.add_(1), stream)
    return replay_gpu_us(g, reps)


def replay_gpu_us(graph: torch.cuda.CUDAGraph, reps: int = 500) -> Stat:
    """GPU time of one replay (CUDA events around it, us), each on an idle device, after
    20 replays of warm-up."""
    for _ in range(20):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gpu = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        gpu.append(start.elapsed_time(end) * 1e3)
    return Stat.of(gpu)


def run_bench(
    config: ArenaConfig,
    builders_factory: Callable[[], list],
    step_factory: Callable[[ArenaConfig], Callable] | None,
    sizes: Sequence[int],
    *,
    reps: int = 200,
    preset: str = "custom",
    consumer_name: str = "metadata only",
    seed: int = 0,
    progress: bool = True,
) -> BenchReport:
    """Capture ``sizes`` and time graph replay vs the eager path for each."""
    builders = builders_factory()
    arena, inputs = make_arena(config, builders)
    step = step_factory(config) if step_factory is not None else (lambda batch, md: None)
    report = BenchReport(environment(), preset, config.next_n, consumer_name,
                         one_kernel_replay_us())
    rng = np.random.default_rng(seed)
    with GraphManager(arena, inputs, builders, step, progress=progress, time_gpu=True) as gm:
        gm.capture(sizes)
        for size in sorted(gm.graphs):
            g = gm.graphs[size]
            batch = random_uniform_decode(inputs, g.num_reqs, rng, short_fraction=0.0,
                                          invalid_fraction=0.0)
            args = (batch.query_lens, batch.seq_lens, batch.slot_mapping)
            for _ in range(10):  # warm both paths (eager kernels compile on first use)
                assert gm.run(*args).mode == "graph"
                gm.run(*args, eager=True)
            gh, gg = _timed_runs(gm, args, False, reps)
            eh, eg = _timed_runs(gm, args, True, reps)
            nodes = g.nodes or {}
            report.rows.append(BenchRow(
                size, g.num_reqs, nodes.get("kernel"), sum(nodes.values()) if nodes else None,
                Stat.of(gh), Stat.of(gg), Stat.of(eh), Stat.of(eg),
            ))
    return report
