"""Presets side by side: the batch-size bench of several presets in one run (``staticattn
bench --preset deepseek-v4 --compare deepseek-v4.1-flash``), each preset's rows, then per
batch size (in requests) the ratio of every other preset to the first.

Per size it sets beside each other: the host time of one replayed step (``run()``), the GPU
time of the replay (the metadata build, and the step when one is given) and the capture
time of the graph. The ratios are what DeepSeek V4.1's targets are stated in (issue 32:
host time within 10% of V4's, GPU time at most V4's + 20%, every graph captured in under
2 s); the report states them, it does not judge them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from staticattn.bench.bench_report import BenchReport, text_table

__all__ = ["PresetComparison", "RatioRow"]


@dataclass(slots=True)
class RatioRow:
    """One batch size of one preset against the first preset (medians, us; capture in s)."""

    preset: str
    num_reqs: int
    host_us: float
    base_host_us: float
    gpu_us: float
    base_gpu_us: float
    capture_s: float | None
    base_capture_s: float | None

    @property
    def host_ratio(self) -> float:
        return self.host_us / self.base_host_us

    @property
    def gpu_ratio(self) -> float:
        return self.gpu_us / self.base_gpu_us


@dataclass(slots=True)
class PresetComparison:
    """The batch-size reports of several presets, the first being the base."""

    reports: list[BenchReport]

    def ratios(self) -> list[RatioRow]:
        """Every other preset's sizes that the base also measured, against the base."""
        base = {r.num_reqs: r for r in self.reports[0].rows}
        out = []
        for report in self.reports[1:]:
            for row in report.rows:
                b = base.get(row.num_reqs)
                if b is not None:
                    out.append(RatioRow(
                        report.preset, row.num_reqs, row.graph.host_us.median,
                        b.graph.host_us.median, row.graph.gpu_us.median, b.graph.gpu_us.median,
                        row.capture_s, b.capture_s))
        return out

    def table(self) -> str:
        """The ratios as a fixed-width text table."""
        base = self.reports[0].preset
        head = (f"{'preset':<22} {'reqs':>5} | {'run() host':>10} {base[:10]:>10} "
                f"{'x':>5} | {'graph GPU':>9} {base[:9]:>9} {'x':>5} | {'capture s':>9} "
                f"{base[:9]:>9}")
        lines = [
            f"{r.preset:<22} {r.num_reqs:>5} | {r.host_us:>10.1f} {r.base_host_us:>10.1f} "
            f"{r.host_ratio:>5.2f} | {r.gpu_us:>9.1f} {r.base_gpu_us:>9.1f} "
            f"{r.gpu_ratio:>5.2f} | {_seconds(r.capture_s):>9} "
            f"{_seconds(r.base_capture_s):>9}" for r in self.ratios()]
        return text_table(head, lines, f"(microseconds, medians; x = preset / {base}; "
                          "capture: seconds per graph)")

    def text(self) -> str:
        """Every preset's header and table, then the ratios."""
        parts = [f"{r.header()}\n{r.table()}" for r in self.reports]
        return "\n\n".join(parts + [self.table()])

    def to_json(self) -> str:
        """Every report (as :meth:`BenchReport.to_json` gives it) and the ratio rows."""
        ratios = []
        for r in self.ratios():
            d = asdict(r)
            d["host_ratio"], d["gpu_ratio"] = r.host_ratio, r.gpu_ratio
            ratios.append(d)
        return json.dumps({"reports": [json.loads(r.to_json()) for r in self.reports],
                           "ratios": ratios}, indent=2)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
