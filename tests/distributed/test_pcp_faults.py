"""A failed rank of a prefill-context-parallel group is a typed error on every rank within
the step deadline, never a hang: two ranks under torchrun (gloo on CPU, every step eager;
NCCL on two GPUs, every step a replayed graph), rank 1 killed mid-step or stalled past the
deadline (``pcp_fault_rank.py``)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from helpers.fault_launch import DEADLINE_S, SLACK_S, launch_faulty_ranks

RANK = Path(__file__).with_name("pcp_fault_rank.py")


@pytest.mark.multigpu
def test_a_rank_killed_mid_step_is_a_typed_error_on_the_other():
    errors, exits, out = launch_faulty_ranks(RANK, "killed-in-step", DEADLINE_S)
    assert exits[1] == -signal.SIGKILL and 1 not in errors, out[-4000:]
    survivor = errors[0]
    assert survivor["error"] in ("RankFailureError", "RankTimeoutError"), out[-4000:]
    assert survivor["step"] == 3
    # NCCL, a rank lost inside a replayed graph: one deadline for the device, one more for
    # the communicators' abort.
    assert survivor["waited_s"] < (2 if survivor["cuda"] else 1) * DEADLINE_S + SLACK_S
    assert exits[0] == 3  # abandoned: ended at once, nothing torn down


@pytest.mark.multigpu
def test_a_stalled_rank_is_a_typed_error_on_both_ranks():
    errors, exits, out = launch_faulty_ranks(RANK, "stalled", DEADLINE_S)
    waiting, late = errors[0], errors[1]
    assert waiting["error"] == late["error"] == "RankTimeoutError", out[-4000:]
    assert waiting["step"] == late["step"] == 3
    assert 0.9 * DEADLINE_S <= waiting["waited_s"] < DEADLINE_S + SLACK_S
    assert late["waited_s"] < 2.0  # at once on waking, before it launches anything
    assert exits == {0: 3, 1: 3}
