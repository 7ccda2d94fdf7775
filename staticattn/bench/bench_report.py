"""What a benchmark reports: medians with min and max, per size, as a table, JSON and a plot,
under a header that names the device, driver, CUDA, torch and triton."""

from __future__ import annotations

import json
import platform
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

__all__ = ["BenchReport", "BenchRow", "HostGpu", "Stat", "environment", "flat_rows",
           "floor_lines", "host_gpu_plot", "text_table"]


@dataclass(slots=True)
class Stat:
    median: float
    min: float
    max: float

    @classmethod
    def of(cls, xs: Sequence[float]) -> Stat:
        return cls(statistics.median(xs), min(xs), max(xs))


@dataclass(slots=True)
class HostGpu:
    """One path's step: host µs (the launch call's) and GPU µs (CUDA events around it)."""

    host_us: Stat
    gpu_us: Stat

    @classmethod
    def of(cls, host: Sequence[float], gpu: Sequence[float]) -> HostGpu:
        return cls(Stat.of(host), Stat.of(gpu))

    def over(self, base: HostGpu) -> tuple[float, float]:
        """This path's host and GPU medians over ``base``'s."""
        return (self.host_us.median / base.host_us.median,
                self.gpu_us.median / base.gpu_us.median)


def flat_rows(report: dict) -> dict:
    """``report`` (an ``asdict``) with each row's :class:`HostGpu` ``path`` as the published
    JSON keeps it: ``path_host_us`` and ``path_gpu_us`` beside the row's other fields."""
    for row in report["rows"]:
        for path in [k for k, v in row.items() if isinstance(v, dict) and "gpu_us" in v]:
            times = row.pop(path)
            row[f"{path}_host_us"], row[f"{path}_gpu_us"] = times["host_us"], times["gpu_us"]
    return report


@dataclass(slots=True)
class BenchRow:
    size: int
    num_reqs: int
    kernels: int | None
    nodes: int | None
    graph: HostGpu
    eager: HostGpu
    #: ``begin_step()`` + ``launch(k)`` (the in-place API), the engine's writes excluded.
    in_place_host_us: Stat | None = None
    #: The same with the manager's ``validate`` off (the engine vouches for the views).
    in_place_unchecked_host_us: Stat | None = None
    #: Wall time of capturing this size's graph (seconds).
    capture_s: float | None = None

    @property
    def host_ratio(self) -> float:
        return self.eager.over(self.graph)[0]

    @property
    def gpu_ratio(self) -> float:
        return self.eager.over(self.graph)[1]


@dataclass(slots=True)
class BenchReport:
    env: dict
    preset: str
    next_n: int
    consumer: str
    #: The one-kernel graph of :func:`staticattn.bench.floor.launch_floor`, same run.
    floor: dict[str, Stat] | None
    rows: list[BenchRow] = field(default_factory=list)
    #: The graph manager's ``staging_guard``: where the graphs record the staging event.
    staging_guard: str = "staging"

    def table(self) -> str:
        """The rows as a fixed-width text table (microsecond medians), then the floor."""
        head = (f"{'size':>5} {'reqs':>5} {'kern':>5} | {'in-place host':>13} {'unchecked':>9} "
                f"{'run() host':>10} {'graph GPU':>9} | {'eager host':>10} {'eager GPU':>9} | "
                f"{'host x':>7} {'GPU x':>6}")
        lines = []
        for r in self.rows:
            in_place = f"{r.in_place_host_us.median:.1f}" if r.in_place_host_us else "-"
            unchecked = (f"{r.in_place_unchecked_host_us.median:.1f}"
                         if r.in_place_unchecked_host_us else "-")
            lines.append(
                f"{r.size:>5} {r.num_reqs:>5} {r.kernels if r.kernels is not None else '-':>5} | "
                f"{in_place:>13} {unchecked:>9} {r.graph.host_us.median:>10.1f} "
                f"{r.graph.gpu_us.median:>9.1f}"
                f" | {r.eager.host_us.median:>10.1f} {r.eager.gpu_us.median:>9.1f} | "
                f"{r.host_ratio:>7.1f} {r.gpu_ratio:>6.1f}"
            )
        return text_table(head, lines, "(microseconds, medians; host x = eager host / run() "
                          "host)", self.floor)

    def header(self) -> str:
        """One line naming the device, driver, CUDA, torch, Triton, preset and step."""
        e = self.env
        return (f"device {e['device']} | driver {e['driver']} | CUDA {e['cuda']} | torch "
                f"{e['torch']} | triton {e['triton']} | preset {self.preset}, next_n "
                f"{self.next_n}, step: {self.consumer} | staging guard after the "
                f"{self.staging_guard}")

    def to_json(self) -> str:
        """The report as JSON: env, floor and rows with their medians, minima and maxima
        (microseconds) and the host and GPU ratios."""
        d = flat_rows(asdict(self))
        for row, r in zip(d["rows"], self.rows):
            row["host_ratio"], row["gpu_ratio"] = r.host_ratio, r.gpu_ratio
        return json.dumps(d, indent=2)

    def plot(self, path: str) -> None:
        """Write a PNG of host and GPU time per step against batch size to ``path``
        (matplotlib, the ``plot`` extra)."""
        sizes = [r.size for r in self.rows]

        def draw(ax, kind: str) -> None:
            for path_name, style in (("graph", "o-"), ("eager", "s--")):
                st = [getattr(getattr(r, path_name), f"{kind}_us") for r in self.rows]
                med = [s.median for s in st]
                ax.plot(sizes, med, style, label=f"{path_name} replay" if path_name == "graph"
                        else "eager build")
                ax.fill_between(sizes, [s.min for s in st], [s.max for s in st], alpha=0.15)
            if kind == "gpu" and self.floor is not None:
                ax.axhline(self.floor["gpu_us"].median, color="gray", ls=":",
                           label="one-kernel graph")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("batch size (tokens)")
            ax.set_ylabel(f"{'host submit' if kind == 'host' else 'GPU'} time per step (us)")
            ax.grid(True, which="both", alpha=0.3)

        host_gpu_plot(path, (11, 4.2), draw, title=self.header())


def host_gpu_plot(path: str, figsize: tuple[float, float], draw: Callable[[Any, str], None],
                  title: str | None = None) -> None:
    """Write a PNG of two panels side by side, host and GPU time, to ``path``: ``draw(ax,
    kind)`` fills the panel of ``kind`` (``"host"``, ``"gpu"``), then its legend is drawn
    (matplotlib, the ``plot`` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=figsize)
    for ax, kind in zip(axes, ("host", "gpu")):
        draw(ax, kind)
        ax.legend()
    if title is not None:
        fig.suptitle(title, fontsize=8)
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


def text_table(head: str, rows: Iterable[str], note: str,
               floor: dict[str, Stat] | None = None) -> str:
    """A fixed-width text table: ``head``, a rule under it, the ``rows``, the ``note`` and
    the lines of the one-kernel ``floor`` (none when None)."""
    return "\n".join([head, "-" * len(head), *rows, note, *floor_lines(floor)])


def floor_lines(floor: dict[str, Stat] | None) -> list[str]:
    """The one-kernel floor as report lines."""
    if floor is None:
        return []
    names = {"raw_launch_host_us": "launch through cudaGraphLaunch, host",
             "replay_host_us": "launch through CUDAGraph.replay(), host",
             "gpu_us": "replay, GPU"}
    return [f"one-kernel graph, {names[k]}: {v.median:.1f} us (min {v.min:.1f}, max "
            f"{v.max:.1f})" for k, v in floor.items()]
