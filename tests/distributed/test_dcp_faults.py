"""A failed rank of a decode-context-parallel group is a typed error on every rank within
the step deadline, never a hang: two ranks under torchrun (gloo on CPU, every step eager;
NCCL on two GPUs, every step a replayed graph), rank 1 killed before the step check, killed
mid-step, or stalled past the deadline (``dcp_fault_rank.py``). And the verdicts the ranks
settle each step with, on one store."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers.fault_launch import DEADLINE_S, SLACK_S, launch_faulty_ranks

from staticattn.validation.dcp_step import StepVerdicts

RANK = Path(__file__).with_name("dcp_fault_rank.py")


def _launch(scenario: str) -> tuple[dict, dict, str]:
    """Each rank's records (its error, then how its process ended) and the output."""
    errors, exits, out = launch_faulty_ranks(RANK, scenario, DEADLINE_S)
    for r in errors.values():
        assert r["cuda"] == torch.cuda.is_available() and r["step"] == 3, r
        # Graphs on a GPU: the steps before, and the failing one when it was launched.
        assert r["replays"] in ((3, 4) if r["cuda"] else (0,)), r
    return errors, exits, out


@pytest.mark.multigpu
@pytest.mark.parametrize("scenario", ["killed-at-check", "killed-in-step"])
def test_a_killed_rank_is_a_typed_error_on_the_other(scenario):
    errors, exits, out = _launch(scenario)
    assert exits[1] == -signal.SIGKILL and 1 not in errors, out[-4000:]
    survivor = errors[0]
    assert survivor["error"] in ("RankFailureError", "RankTimeoutError"), out[-4000:]
    # NCCL, a rank lost inside a replayed graph: one deadline to wait for the device, at
    # most one more for the communicators' abort (which may itself wait on the lost peer).
    aborted = survivor["cuda"] and scenario == "killed-in-step"
    assert survivor["waited_s"] < (2 if aborted else 1) * DEADLINE_S + SLACK_S
    assert exits[0] == 3  # abandoned: ended at once, nothing torn down
    assert "rank 0: Rank" in out


@pytest.mark.multigpu
def test_a_stalled_rank_is_a_typed_error_on_both_ranks():
    errors, exits, out = _launch("stalled")
    waiting, late = errors[0], errors[1]
    assert waiting["error"] == late["error"] == "RankTimeoutError", out[-4000:]
    assert waiting["replays"] == late["replays"] == (3 if waiting["cuda"] else 0)
    assert 0.9 * DEADLINE_S <= waiting["waited_s"] < DEADLINE_S + SLACK_S
    assert late["waited_s"] < 2.0  # at once on waking, before it launches anything
    assert exits == {0: 3, 1: 3}
    assert f"waited {DEADLINE_S:g} s for every rank to reach the step check" in out


@pytest.fixture
def store():
    return dist.HashStore()


def test_the_first_verdict_settles_a_step_for_every_rank(store):
    ranks = [StepVerdicts(store) for _ in range(3)]
    assert [v.settle(None) for v in ranks] == [None] * 3  # step 0: every rank passed
    # Step 1: rank 0 gave up waiting; the others, arriving later, get its verdict.
    assert ranks[0].settle("late: rank 0 waited") == "late: rank 0 waited"
    assert ranks[1].settle(None) == ranks[2].settle("lost") == "late: rank 0 waited"
    assert store.check(["dcp_step/1"])


def test_a_passed_step_drops_the_verdict_before_it(store):
    first, second = StepVerdicts(store), StepVerdicts(store)
    for _ in range(3):
        assert first.settle(None) is None and second.settle(None) is None
    assert not store.check(["dcp_step/0"]) and not store.check(["dcp_step/1"])
    assert store.check(["dcp_step/2"])


def test_an_unreachable_store_fails_the_step():
    class Gone(dist.HashStore):
        def compare_set(self, *args):
            raise RuntimeError("connection refused")

    assert "unreachable: connection refused" in StepVerdicts(Gone()).settle(None)
