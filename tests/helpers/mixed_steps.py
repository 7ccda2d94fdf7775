"""The mixed builds' test setting: small configs of every family and MTP width, token
buckets, the staging of a step for a bucket and its check against the oracle (shared by the
mixed-build, DCP and V4.1 build tests)."""

from __future__ import annotations

import numpy as np

from helpers.support import DEVICE, _t
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
    """Stage ``step`` for a bucket of ``num_reqs`` requests and ``num_tokens`` tokens, run every
    builder's mixed build and compare it with the oracle."""
    batch = stage_mixed(inputs, step, num_reqs, num_tokens)
    metas = {b.name: b.build_mixed(batch) for b in builders}
    exp = oracle.indexer(cfg, step, num_reqs, num_tokens, max_chunks(cfg, num_reqs, num_tokens))
    oracle.assert_indexer_matches(metas["indexer"], exp, cfg, step)
    if "swa" in metas:
        oracle.assert_swa_matches(metas["swa"], oracle.swa(cfg, step, num_reqs, num_tokens),
                                  cfg, step)


def world(name: str, backend: str):
    """``(config, builders, inputs)`` of the named config on ``backend``."""
    cfg = CONFIGS[name](device=DEVICE, kernel_backend=backend)
    builders = [IndexerMetadataBuilder()] + ([SparseSWAMetadataBuilder()] if cfg.has_swa
                                             else [])
    _, inputs = make_arena(cfg, builders)
    return cfg, builders, inputs
