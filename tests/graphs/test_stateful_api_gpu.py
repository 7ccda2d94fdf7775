"""The state machine of ``helpers/stateful_api.py`` on a GPU, real graphs captured: at least
``STATICATTN_STATEFUL_STEPS`` steps per preset, compiled Triton kernels.

The default run is short (300 steps per preset), so the README's test command stays within
minutes; the long one is opt-in: ``STATICATTN_STATEFUL_STEPS=5000`` (what ``./dev.sh
gpu-check`` sets)."""

from __future__ import annotations

import os
from collections import Counter

import pytest
from helpers import stateful_api
from helpers.stateful_api import DEFAULT_GPU_STEPS, check_not_vacuous, run_machine

pytestmark = pytest.mark.gpu

STEPS = int(os.environ.get("STATICATTN_STATEFUL_STEPS", DEFAULT_GPU_STEPS))
#: Steps per example: long runs, since every example captures its graphs first.
PER_EXAMPLE = 200


@pytest.mark.parametrize("preset", ["deepseek-v3.2", "deepseek-v4", "deepseek-v4.1-flash",
                                    "deepseek-v4-vision"])
def test_public_api_against_the_oracle_on_the_gpu(preset):
    # New examples every round (derandomize off); a failure prints its blob.
    done, ran = 0, Counter()
    while done < STEPS:  # hypothesis draws runs of varying length: run until enough steps
        run_machine(preset, "triton", max(1, (STEPS - done) // (PER_EXAMPLE // 2)),
                    PER_EXAMPLE, derandomize=False, check=False)
        done += steps_run()
        ran += stateful_api.STATS
    # Over the whole run: a short last round may draw one path only.
    check_not_vacuous(preset, ran)


def steps_run() -> int:
    """The steps of the last round: ``STATS``' ``(path, invalid)`` entries, one per step (its
    other entries tally what the steps carried -- spans, replay starts -- on top)."""
    return sum(count for key, count in stateful_api.STATS.items()
               if isinstance(key, tuple) and key[0] in stateful_api.PATHS)
