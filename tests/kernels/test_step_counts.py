"""The Triton helpers that read a step's counts (``kernels/staging/step_counts.py``) read the slots
``COUNT_*`` that the staging writes, or the launch's own count without device counts
(interpreted on CPU, compiled on a GPU)."""

from __future__ import annotations

import pytest
import torch

from staticattn.kernels.runtime.deferred import lazy_jit
from staticattn.kernels.staging.stage_inputs import (
    COUNT_DECODE_TOKENS,
    COUNT_DECODES,
    COUNT_REQS,
    COUNT_TOKENS,
    NUM_COUNTS,
)
from staticattn.kernels.staging.step_counts import step_counts_jit

STATIC = 100


@lazy_jit(step_counts_jit)
def _probe_kernel(triton, tl, live_count, SLOT_REQS, SLOT_TOKENS, SLOT_DECODES, SLOT_DECODE_TOKENS):
    @triton.jit
    def probe(counts, out, static, DEVICE_COUNTS: tl.constexpr):
        # Each helper gets its own static count, so a helper that returns another's shows.
        tl.store(out, live_count(counts, SLOT_REQS, static, DEVICE_COUNTS))
        tl.store(out + 1, live_count(counts, SLOT_TOKENS, static + 1, DEVICE_COUNTS))
        tl.store(out + 2, live_count(counts, SLOT_DECODES, static + 2, DEVICE_COUNTS))
        tl.store(out + 3, live_count(counts, SLOT_DECODE_TOKENS, static + 3, DEVICE_COUNTS))

    return probe


@pytest.mark.parametrize("device_counts", [True, False])
def test_each_helper_reads_its_slot_or_the_static_count(device, device_counts):
    counts = torch.tensor([7, 31, 3, 5], dtype=torch.int32, device=device)
    assert counts.numel() == NUM_COUNTS
    out = torch.full((4,), -1, dtype=torch.int32, device=device)
    _probe_kernel()[(1,)](counts, out, STATIC, DEVICE_COUNTS=device_counts)
    slots = [COUNT_REQS, COUNT_TOKENS, COUNT_DECODES, COUNT_DECODE_TOKENS]
    want = ([int(counts[s]) for s in slots] if device_counts
            else [STATIC + i for i in range(4)])
    assert out.tolist() == want
