"""The state machine of ``stateful_api.py`` on CPU: every preset (the vision one with image
spans) on the torch kernels, and DeepSeek V4 on the Triton kernels (interpreted), bounded
examples; every path must have run valid steps and refused invalid ones."""

from __future__ import annotations

import pytest
import stateful_api
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test
from stateful_api import PATHS, ApiMachine

pytestmark = pytest.mark.skipif(stateful_api.CUDA, reason="on a GPU the machine captures real "
                                "graphs: test_stateful_api_gpu.py runs it there")

CASES = [("deepseek-v3.2", "torch", 25), ("deepseek-v4", "torch", 25),
         ("deepseek-v4.1-flash", "torch", 12), ("deepseek-v4-vision", "torch", 12),
         ("deepseek-v4", "triton", 3)]


def run_machine(preset: str, backend: str, examples: int, steps_per_example: int,
                derandomize: bool = True) -> None:
    """Run the machine of ``preset`` on ``backend``; then check it was not vacuous.
    ``derandomize=False`` draws new examples on every call (a long run made of rounds)."""
    stateful_api.STATS.clear()
    machine = type(f"Machine_{preset}_{backend}".replace("-", "_").replace(".", "_"),
                   (ApiMachine,), {"preset": preset, "backend": backend})
    run_state_machine_as_test(machine, settings=settings(
        max_examples=examples, stateful_step_count=steps_per_example, deadline=None,
        suppress_health_check=list(HealthCheck), derandomize=derandomize, database=None,
        print_blob=True))
    ran = stateful_api.STATS
    assert all(ran[path, False] for path in PATHS), ran
    assert sum(ran[path, True] for path in PATHS), ran
    if "vision" in preset:  # valid and invalid image spans both drawn
        assert ran["spans", False] and ran["spans", True], ran


@pytest.mark.parametrize("preset, backend, examples", CASES,
                         ids=[f"{p}-{b}" for p, b, _ in CASES])
def test_public_api_against_the_oracle(preset, backend, examples):
    run_machine(preset, backend, examples, 30)
