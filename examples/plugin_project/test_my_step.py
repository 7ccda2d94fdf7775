"""A user's test suite: is my step safe to capture in a CUDA graph?"""

from __future__ import annotations

import pytest
from my_step import MyStep, MyStepWithSync, config

from staticattn.checks.pytest_plugin import GraphSafetyError


def test_my_step_is_graph_safe(assert_graph_safe):
    cfg = config()
    report = assert_graph_safe(MyStep(cfg), config=cfg, sizes=[2, 16], batches=10)
    assert report.ok and not report.errors
    assert [s.size for s in report.sizes] == [2, 16]


def test_a_sync_is_reported(assert_graph_safe):
    cfg = config()
    with pytest.raises(GraphSafetyError) as failed:
        assert_graph_safe(MyStepWithSync(cfg), config=cfg, sizes=[2], batches=2)
    assert "sync" in failed.value.report.kinds("error")
    assert "FAIL" in str(failed.value)
