"""Test setup: interpreted Triton on CPU, the `gpu` marker, hypothesis profiles."""

from __future__ import annotations

import os

import torch

# Triton picks compiled vs interpreted when a kernel is defined, and staticattn defines its
# kernels lazily, so switching the interpreter on here covers every Triton kernel on CPU.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# pytest-xdist workers share the machine's cores, but torch gives each of them every core for
# its intra-op threads: on 16 cores, 16 workers of 16 threads each made the CPU emulations of
# the real kernels run 20x slower than alone. Each worker takes its share.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True,
    print_blob=True,
)
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


def backends_here() -> list[str]:
    """Kernel backends testable on this machine: torch always; Triton compiled on CUDA or
    interpreted on CPU."""
    return ["torch", "triton"]


@pytest.fixture(params=backends_here())
def backend(request) -> str:
    return request.param


@pytest.fixture
def device() -> str:
    """Where kernels run in tests (:data:`support.DEVICE`)."""
    from helpers.support import DEVICE

    return DEVICE
