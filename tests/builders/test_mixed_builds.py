"""The mixed builds (a step of any composition, for a token bucket) against their oracle.

Randomized steps of every kind (uniform and variable MTP decodes, extends, prefills, slot -1
tokens) are staged for a bucket of ``T`` tokens and ``R`` requests -- the real counts reach
the kernels only on the device -- and both builders' ``build_mixed`` outputs are compared
with ``oracle.mixed`` over the whole extent of every view, padding included. Both kernel
backends (Triton interpreted on CPU, compiled on a GPU).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.mixed_steps import CONFIGS, bucket_for, check_mixed, world
from helpers.support import host_steps, make_step
from hypothesis import given, settings


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_mixed_builds_match_the_oracle(backend, name):
    cfg, builders, inputs = world(name, backend)

    @settings(max_examples=60 if backend == "torch" else 25)
    @given(host_steps(cfg, max_seq_len=4096))
    def check(step):
        num_reqs, num_tokens = bucket_for(cfg, step.num_tokens,
                                          np.random.default_rng(step.num_tokens))
        check_mixed(cfg, builders, inputs, step, num_reqs, num_tokens)

    check()


def test_reference_mixed_shape_with_subchunks(backend):
    """Decodes, a fresh prefill and a long continuation whose keys exceed the logits budget,
    so the plan has request ranges and query sub-chunks; then a pure decode step in the same
    bucket clears every prefill output back to its padded values."""
    cfg, builders, inputs = world("v4-n2", backend)
    rng = np.random.default_rng(3)
    mixed = make_step(cfg, [2, 2, 1, 60, 100], [900, 40, 3000, 60, 4000], rng=rng)
    check_mixed(cfg, builders, inputs, mixed, 16, 256)
    decodes = make_step(cfg, [2, 2, 2], [17, 4000, 129], rng=rng)
    check_mixed(cfg, builders, inputs, decodes, 16, 256)
