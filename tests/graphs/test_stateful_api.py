"""The state machine of ``helpers/stateful_api.py`` on CPU: every preset (the vision one with image
spans) on the torch kernels, and DeepSeek V4 on the Triton kernels (interpreted), bounded
examples; every path must have run valid steps and refused invalid ones, and the vision
preset's fixed draw an in-place scan of the span block after ``run`` calls whose span
counts fell (rare: the GPU's rounds of new examples need not draw it)."""

from __future__ import annotations

import pytest
from helpers import stateful_api
from helpers.stateful_api import run_machine

pytestmark = pytest.mark.skipif(stateful_api.CUDA, reason="on a GPU the machine captures real "
                                "graphs: graphs/test_stateful_api_gpu.py runs it there")

CASES = [("deepseek-v3.2", "torch", 25), ("deepseek-v4", "torch", 25),
         ("deepseek-v4.1-flash", "torch", 12), ("deepseek-v4-vision", "torch", 12),
         ("deepseek-v4", "triton", 3)]


@pytest.mark.parametrize("preset, backend, examples", CASES,
                         ids=[f"{p}-{b}" for p, b, _ in CASES])
def test_public_api_against_the_oracle(preset, backend, examples):
    run_machine(preset, backend, examples, 30)
    if "vision" in preset:
        assert stateful_api.STATS["scan after falling span counts"], stateful_api.STATS
