"""``bench --pcp``'s GPU time of a rank's step brackets its launch alone: the host checks
and the staging run before the first event, as the one-GPU step is timed (the CUDA events
are stood in for on CPU, recording the order of what ran)."""

from __future__ import annotations

import torch

from staticattn.distributed import pcp_bench


class _Events:
    """Stand-ins for ``torch.cuda.Event``: each records itself in ``log``; the elapsed time
    is the number of log entries between two events (ms)."""

    def __init__(self, log: list) -> None:
        self.log = log

    def __call__(self, enable_timing: bool = False):
        log = self.log

        class Event:
            def record(self) -> None:
                self.at = len(log)
                log.append("event")

            def synchronize(self) -> None:
                pass

            def elapsed_time(self, end) -> float:
                return float(end.at - self.at)

        return Event()


class _Rank:
    def __init__(self, log: list, graph: bool) -> None:
        self.log = log
        self.graph = self if graph else None

    def check(self, *args) -> None:
        self.log.append("check")

    def stage(self, *args) -> None:
        self.log.append("stage")

    def replay(self) -> None:
        self.log.append("replay")

    def body(self) -> None:
        self.log.append("body")


def test_the_events_bracket_the_launch_alone(monkeypatch):
    log: list = []
    monkeypatch.setattr(torch.cuda, "Event", _Events(log))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: log.append("sync"))
    step = {"query_lens": [1], "is_prefilling": [False], "num_computed": [3],
            "req_state_idx": [0]}
    for graph, launch in ((True, "replay"), (False, "body")):
        log.clear()
        times = pcp_bench._replay_gpu_times(_Rank(log, graph), step, 2,
                                            lambda: log.append("align"))
        one = ["align", "check", "stage", "sync", "event", launch, "event"]
        assert log == one * 2
        assert times == [2e3, 2e3]  # the launch between the events, nothing else
