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
from hypothesis import given, settings
from support import DEVICE, _t, host_steps, make_step

from staticattn.arena import ArenaConfig
from staticattn.builders import (
    Batch,
    IndexerMetadataBuilder,
    SparseSWAMetadataBuilder,
    make_arena,
)
from staticattn.builders.indexer.prefill import max_chunks
from staticattn.reference import mixed as oracle

SMALL = dict(max_num_seqs=16, max_num_batched_tokens=256, max_model_len=4096,
             max_prefill_workspace=3000, max_logits_bytes=200_000)
CONFIGS = {
    "v3.2-n1": lambda **kw: ArenaConfig.deepseek_v32(**SMALL, **kw),
    "v4-n1": lambda **kw: ArenaConfig.deepseek_v4(**SMALL, num_speculative_tokens=0, **kw),
    "v4-n2": lambda **kw: ArenaConfig.deepseek_v4(**SMALL, num_speculative_tokens=1, **kw),
    "v4-n4-flatten": lambda **kw: ArenaConfig.deepseek_v4(**SMALL, num_speculative_tokens=3,
                                                          **kw),
    "v4-n8-flatten": lambda **kw: ArenaConfig.deepseek_v4(**SMALL, num_speculative_tokens=7,
                                                          **kw),
}


def bucket_for(cfg: ArenaConfig, num_tokens: int, rng: np.random.Generator) -> tuple[int, int]:
    """A token bucket holding the step (the next power of two, sometimes larger) and its
    request capacity."""
    t = 1 << max(int(num_tokens) - 1, 0).bit_length()
    if rng.random() < 0.3:
        t *= 2
    t = min(max(t, 1), cfg.max_num_batched_tokens)
    return min(cfg.max_num_seqs, t), t


def stage_mixed(inputs, step, num_reqs: int, num_tokens: int) -> Batch:
    """Write the step's tables, stage its real values, run the general staging over the
    bucket's extent; the returned batch is the one a mixed graph is captured with."""
    r = step.num_reqs
    inputs.block_table[:r].copy_(_t(step.block_table))
    if step.swa_block_table is not None:
        inputs.swa_block_table[:r].copy_(_t(step.swa_block_table))
    inputs.stage(step.query_lens, step.seq_lens, step.slot_mapping)
    inputs.copy_to_device(num_reqs, num_tokens)
    return Batch.for_mixed_capture(inputs, num_reqs, num_tokens)


def check_mixed(cfg, builders, inputs, step, num_reqs, num_tokens) -> None:
    batch = stage_mixed(inputs, step, num_reqs, num_tokens)
    metas = {b.name: b.build_mixed(batch) for b in builders}
    exp = oracle.indexer(cfg, step, num_reqs, num_tokens, max_chunks(cfg, num_reqs, num_tokens))
    oracle.assert_indexer_matches(metas["indexer"], exp, cfg, step)
    if "swa" in metas:
        oracle.assert_swa_matches(metas["swa"], oracle.swa(cfg, step, num_reqs, num_tokens),
                                  cfg, step)


def _world(name: str, backend: str):
    cfg = CONFIGS[name](device=DEVICE, kernel_backend=backend)
    builders = [IndexerMetadataBuilder()] + ([SparseSWAMetadataBuilder()] if cfg.has_swa
                                             else [])
    _, inputs = make_arena(cfg, builders)
    return cfg, builders, inputs


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_mixed_builds_match_the_oracle(backend, name):
    cfg, builders, inputs = _world(name, backend)

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
    cfg, builders, inputs = _world("v4-n2", backend)
    rng = np.random.default_rng(3)
    mixed = make_step(cfg, [2, 2, 1, 60, 100], [900, 40, 3000, 60, 4000], rng=rng)
    check_mixed(cfg, builders, inputs, mixed, 16, 256)
    decodes = make_step(cfg, [2, 2, 2], [17, 4000, 129], rng=rng)
    check_mixed(cfg, builders, inputs, decodes, 16, 256)
