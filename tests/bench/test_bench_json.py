"""The bench reports' JSON keeps the row keys of the published results: a path's host and
GPU times as ``path_host_us`` / ``path_gpu_us`` beside the row's other fields."""

from __future__ import annotations

import json
from pathlib import Path

from staticattn.bench.bench_report import BenchReport, BenchRow, HostGpu, Stat, environment
from staticattn.bench.mixed_steps import MixedReport, MixedRow

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def _stat(x: float) -> Stat:
    return Stat(x, x * 0.9, x * 1.2)


def _row_keys(path: str) -> set[str]:
    return set(json.loads((RESULTS / path).read_text())["rows"][0])


def test_the_decode_bench_rows_keep_the_published_keys():
    row = BenchRow(4, 2, 9, 12, HostGpu(_stat(10.0), _stat(20.0)),
                   HostGpu(_stat(300.0), _stat(60.0)), _stat(7.0), _stat(6.5), 0.25)
    data = json.loads(BenchReport(environment(), "deepseek-v4", 2, "metadata only", None,
                                  [row]).to_json())["rows"][0]
    assert set(data) == _row_keys("bench_v4_h200.json") | {"capture_s"}
    assert data["graph_host_us"] == {"median": 10.0, "min": 9.0, "max": 12.0}
    assert data["eager_gpu_us"]["median"] == 60.0
    assert (data["host_ratio"], data["gpu_ratio"]) == (30.0, 3.0)


def test_the_mixed_bench_rows_keep_the_published_keys():
    row = MixedRow("reference mixed batch", "V4", 2, 18, 6032, 8192,
                   HostGpu(_stat(20.0), _stat(58.0)), _stat(9.0),
                   HostGpu(_stat(400.0), _stat(350.0)), HostGpu(_stat(70.0), _stat(60.0)))
    data = json.loads(MixedReport(environment(), None, [row]).to_json())["rows"][0]
    assert set(data) == _row_keys("bench_mix_h200.json")
    assert (data["graph_gpu_us"]["median"], data["fallback_host_us"]["median"]) == (58.0, 70.0)
