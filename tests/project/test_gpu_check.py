"""``./dev.sh gpu-check`` (scripts/gpu_check.py): the long public-API state machine is its
opt-in, the README's test command runs the short one; without CUDA it says SKIPPED with the
command line's exit status for skipped (3)."""

from __future__ import annotations

import sys

import pytest
import torch
from helpers.doc_blocks import ROOT
from helpers.stateful_api import DEFAULT_GPU_STEPS

from staticattn.cli import ExitCode

sys.path.insert(0, str(ROOT / "scripts"))
import gpu_check  # noqa: E402

sys.path.remove(str(ROOT / "scripts"))


def test_the_long_state_machine_is_opt_in():
    assert DEFAULT_GPU_STEPS == 300
    assert gpu_check.STATEFUL_STEPS == "5000"
    readme = (ROOT / "README.md").read_text()
    assert "STATICATTN_STATEFUL_STEPS=5000" in readme and "./dev.sh gpu-check" in readme


@pytest.mark.skipif(torch.cuda.is_available(), reason="without CUDA only")
def test_gpu_check_without_cuda_is_skipped(capsys):
    assert gpu_check.main([]) == ExitCode.SKIPPED == gpu_check.SKIPPED
    assert capsys.readouterr().out.startswith("SKIPPED: gpu-check: no CUDA device here")
