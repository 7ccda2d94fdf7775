"""On the GPU: no Python collection runs inside a capture (``staticattn.graphs.python_gc``
says why: a pinned block freed mid-capture poisons torch's host allocator). The graph
capture (``capturer.capture``) and a recorded launch's census capture each run their body
with the gc off and turn it back on after; the manager's captures too, through them."""

from __future__ import annotations

import gc

import pytest
import torch

from staticattn.graphs.captured import GraphKind
from staticattn.graphs.capturer import capture
from staticattn.graphs.recorded_launches import RecordedLaunches

pytestmark = pytest.mark.gpu


def _spy(seen: list[bool], out: torch.Tensor):
    """A body that notes, when it runs under a capture, whether the gc is on."""
    def body(*_):
        if torch.cuda.is_current_stream_capturing():
            seen.append(gc.isenabled())
        out.add_(1)
        return None, {}
    return body


def test_the_graph_capture_runs_its_body_with_the_gc_off():
    seen: list[bool] = []
    out = torch.zeros(1, device="cuda")
    assert gc.isenabled()
    capture(_spy(seen, out), torch.cuda.Stream())
    assert seen == [False] and gc.isenabled()


@pytest.mark.skipif(not RecordedLaunches.available(), reason="needs cuda-bindings")
def test_a_recorded_launch_census_runs_the_builds_with_the_gc_off():
    seen: list[bool] = []
    out = torch.zeros(1, device="cuda")
    recorded = RecordedLaunches(_spy(seen, out))
    for _ in range(2):  # noted, then recorded under a relaxed capture
        recorded.run(GraphKind.MIXED, 1, 8)
    assert seen == [False] and gc.isenabled()


def test_a_failed_capture_turns_the_gc_back_on():
    def body():
        raise RuntimeError("a build failed")
    with pytest.raises(RuntimeError, match="a build failed"):
        capture(body, torch.cuda.Stream())
    assert gc.isenabled()
