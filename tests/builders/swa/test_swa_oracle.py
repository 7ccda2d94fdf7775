"""Hypothesis: every output field of both builds equals the oracle, on both backends, over
realistic steps (MTP decodes, padded uniform batches, slot -1 tokens, mixed with prefills).

One arena per (config, backend) serves every example, so a row left stale by an earlier
example would fail a later one.
"""

from __future__ import annotations

import functools

import pytest
import torch
from helpers.support import DEVICE, fuzz_examples, host_steps, stage
from hypothesis import HealthCheck, given, settings

from staticattn.arena import ArenaConfig
from staticattn.builders import Batch, make_arena
from staticattn.builders.swa.builder import SparseSWAMetadataBuilder
from staticattn.reference.swa import assert_matches, expected_for_step

BASE = dict(device=DEVICE, max_num_seqs=16, max_num_batched_tokens=512, max_model_len=2048,
            architecture="deepseek_v4")

# Windows 1, 7, 128; SWA blocks 16, 64; ratios [1], [1,4], [1,4,128]; next_n 1-4 and 8; C128A
# with 1, 2 and 4 compressed entries per main block.
CONFIGS = {
    "w1-bs16-swa-n1": dict(sliding_window=1, swa_block_size=16, compress_ratios=(1,)),
    "w7-bs16-c4a-n2": dict(sliding_window=7, swa_block_size=16, compress_ratios=(1, 4),
                           block_size=256, num_speculative_tokens=1),
    "w128-bs64-c128a-n4": dict(sliding_window=128, swa_block_size=64,
                               compress_ratios=(1, 4, 128),
                               block_size=256, num_speculative_tokens=3),
    "w7-bs64-c128a-n3": dict(sliding_window=7, swa_block_size=64, compress_ratios=(1, 4, 128),
                             block_size=512, num_speculative_tokens=2,
                             max_model_len=8192),
    "w128-bs16-swa-n2": dict(sliding_window=128, swa_block_size=16, compress_ratios=(1,),
                             num_speculative_tokens=1),
    "w1-bs64-c128a-n1": dict(sliding_window=1, swa_block_size=64, compress_ratios=(1, 128),
                             block_size=128, max_model_len=4096),
    "w128-bs64-c128a-n8": dict(sliding_window=128, swa_block_size=64,
                               compress_ratios=(1, 4, 128),
                               block_size=256, num_speculative_tokens=7),
}


# ``backend`` is a constant string per test; nothing in it needs resetting between examples.
FIXTURE_OK = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


@functools.cache
def _bound(name: str, backend: str):
    cfg = ArenaConfig(**{**BASE, **CONFIGS[name], "kernel_backend": backend})
    builder = SparseSWAMetadataBuilder()
    arena, inputs = make_arena(cfg, [builder])
    _assert_rows_end_at_their_lengths(arena, "the fresh arena")
    return cfg, builder, inputs


def _assert_rows_end_at_their_lengths(arena, when: str) -> None:
    """The kernels' invariant over whole buffers, not only the step's rows: every entry at
    or past a row's stored length is -1 (the Triton kernel writes a row only up to the longer
    of its new and previous length, so a stale entry would outlive every later step)."""
    for rows_name, lens_name in (("swa.dense_prefill_indices", "swa.dense_prefill_lens"),
                                 ("swa.dense_decode_indices", "swa.dense_decode_lens"),
                                 ("swa.prefill_swa_indices", "swa.prefill_swa_lens")):
        if rows_name not in arena:
            continue
        rows = arena[rows_name].reshape(arena[rows_name].shape[0], -1)
        lens = arena[lens_name]
        cols = torch.arange(rows.shape[1], device=rows.device)
        stale = ((cols[None, :] >= lens[:, None]) & (rows != -1)).any(1).nonzero()
        assert stale.numel() == 0, (
            f"{rows_name} {when}: rows {stale.flatten()[:8].tolist()} hold entries past their "
            f"length (row {int(stale[0])}: length {int(lens[stale[0]])}, "
            f"{rows[stale[0]].flatten()[:8].tolist()})")


@pytest.mark.parametrize("name", CONFIGS)
def test_build_matches_oracle(name, backend):
    cfg, builder, inputs = _bound(name, backend)

    @settings(max_examples=fuzz_examples(backend, 100, 25), suppress_health_check=FIXTURE_OK)
    @given(step=host_steps(cfg, max_reqs=12))
    def check(step):
        _assert_rows_end_at_their_lengths(builder.arena, "before the build")
        meta = builder.build(stage(inputs, step))
        assert_matches(meta, expected_for_step(cfg, step))
        _assert_rows_end_at_their_lengths(builder.arena, "after the build")

    check()


@pytest.mark.parametrize("name", CONFIGS)
def test_build_decode_matches_oracle(name, backend):
    cfg, builder, inputs = _bound(name, backend)

    @settings(max_examples=fuzz_examples(backend, 60, 15), suppress_health_check=FIXTURE_OK)
    @given(step=host_steps(cfg, kinds=("uniform_decode",), max_reqs=12))
    def check(step):
        stage(inputs, step)
        meta = builder.build_decode(Batch.for_decode_capture(inputs, step.num_reqs_padded))
        assert_matches(meta, expected_for_step(cfg, step))

    check()
