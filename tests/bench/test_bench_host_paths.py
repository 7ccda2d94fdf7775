"""The host-path benches: the mixed report's table and JSON from given figures (CPU), and on
the GPU one short run of the per-phase breakdown naming every path and phase (the figures
themselves are the bench's, not asserted)."""

from __future__ import annotations

import json

import pytest

from staticattn.bench.bench_report import HostGpu, Stat, environment
from staticattn.bench.mixed_steps import MixedReport, MixedRow


def _stat(x: float) -> Stat:
    return Stat(x, x * 0.9, x * 1.2)


def test_the_mixed_report_shows_both_eager_paths():
    row = MixedRow("reference mixed batch", "V4", 2, 18, 6032, 8192,
                   HostGpu(_stat(20.0), _stat(58.0)), _stat(9.0),
                   HostGpu(_stat(400.0), _stat(350.0)), HostGpu(_stat(70.0), _stat(60.0)))
    report = MixedReport(environment(), None, [row])
    table = report.table()
    assert "fallbk" in table and "  70.0   60.0 |   400.0  350.0 |   20.0" in table, table
    assert json.loads(report.to_json())["rows"][0]["fallback_host_us"]["median"] == 70.0


@pytest.mark.gpu
def test_the_breakdown_names_every_path_and_phase():
    from staticattn.arena import ArenaConfig
    from staticattn.bench.breakdown import run_breakdown
    from staticattn.builders import default_builders

    cfg = ArenaConfig.deepseek_v4(max_model_len=65536)  # the mixed batch reaches 23K
    report = run_breakdown(cfg, default_builders, num_reqs=8, reps=5)
    text = report.table()
    for label in ("run(), decode replay", "in-place, decode replay",
                  "run(eager=GRAPH), decode", "run(eager=GRAPH), reference mixed batch",
                  "run(eager=GRAPH), decode, launches recorded",
                  "run(eager=GRAPH), decode, no recorded launches",
                  "run(eager=REFERENCE), decode", "run(eager=REFERENCE), reference mixed batch",
                  "cudaGraphLaunch"):
        assert label in text, text
    assert "graph builds + step" in text and "build indexer" in text
    data = json.loads(report.to_json())  # what --json prints
    assert data["paths"]["run(), decode replay"]["total"] > 0
    assert data["floor"]["raw_launch_host_us"]["median"] > 0
