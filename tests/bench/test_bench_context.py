"""The context bench (``bench --context``): its report on CPU from given figures, and on the
GPU one real run of a small arena (the figures themselves are the bench's, not asserted)."""

from __future__ import annotations

import json

import pytest
import torch

from staticattn.bench.bench_report import HostGpu, Stat, environment
from staticattn.bench.context import ContextReport, ContextRow, run_context_bench
from staticattn.builders import IndexerMetadataBuilder, SparseSWAMetadataBuilder


def _stat(x: float) -> Stat:
    return Stat(x, x * 0.9, x * 1.2)


def _times(gpu: float, host: float) -> HostGpu:
    return HostGpu(_stat(host), _stat(gpu))


def test_the_report_gives_the_ratio_per_context():
    report = ContextReport(environment(), "deepseek-v4", 1 << 20, "metadata only", [
        ContextRow(2048, 32, _times(30.0, 8.0), _times(20.0, 7.5)),
        ContextRow(65536, 32, _times(33.0, 8.0), _times(30.0, 7.9)),
    ])
    assert [round(r.gpu_ratio, 2) for r in report.rows] == [1.5, 1.1]
    table = report.table()
    assert "max_model_len 1,048,576" in table and "    2,048    32 |" in table
    assert json.loads(report.to_json())["gpu_ratios"] == [1.5, 1.1]
    report.rows[0].bucketed = _times(21.0, 7.0)
    assert report.rows[0].bucketed_ratio == pytest.approx(1.05)
    assert json.loads(report.to_json())["bucketed_ratios"][0] == pytest.approx(1.05)
    report.rows[0].capacity_pool_bytes, report.rows[0].bucketed_pool_bytes = 3 << 20, 5 << 20
    assert "1.05 |     3.0     5.0" in report.table()


@pytest.mark.gpu
def test_a_small_run_times_both_graphs():
    report = run_context_bench(
        "deepseek-v4", [1024, 4096], 16384,
        lambda: [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()], None, batches=(4,),
        reps=5)
    assert [(r.context, r.num_reqs) for r in report.rows] == [(1024, 4), (4096, 4)]
    for r in report.rows:
        assert r.capacity.gpu_us.median > 0 and r.ideal.gpu_us.median > 0
        assert r.bucketed.gpu_us.median > 0 and r.bucketed_ratio > 0
        assert r.capacity_pool_bytes == r.bucketed_pool_bytes == 0  # builds write the arena
    assert torch.cuda.get_device_name() in report.table()
