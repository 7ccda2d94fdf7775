"""The DSpark draft step's SWA metadata (``docs/spec/deepseek-v41.md`` §7.5): a worked
example, the width rule, and hypothesis tests of the eager and graph (decode) builds against
``staticattn.reference.v41_decoder_replay.draft_rows`` for the V4 and V4.1-Flash shapes on both
backends."""

from __future__ import annotations

import functools

import pytest
from helpers.v41_swa_steps import (
    CONFIGS,
    EXAMPLE_V41,
    example_step,
    oracle_step,
    replayed_steps,
    stage_eager,
    world,
)
from hypothesis import HealthCheck, given, settings

from staticattn.arena import ArenaConfig
from staticattn.builders import Batch
from staticattn.builders.swa.draft import DraftSWAMetadataBuilder, draft_swa_width
from staticattn.errors import ConfigError
from staticattn.reference import v41_decoder_replay as v41_replay

FIXTURE_OK = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


@functools.cache
def _world(name: str, backend: str):
    return world(name, backend, DraftSWAMetadataBuilder())


def test_example_non_causal_window(backend):
    cfg, builder, inputs = _world("example", backend)
    # Draft blocks of next_n = 2: L = 10 (prefix 8 -> window 4 .. 9), L = 3 (prefix 1 -> 0 .. 2),
    # and a padded request.
    step, rs = example_step(cfg, [2, 2], [10, 3], [[1, 5, 7], [6]], num_reqs_padded=3,
                            num_tokens_padded=6)
    stage_eager(inputs, step, rs)
    inputs.copy_to_device(3, 6, uniform=True)
    meta = builder.build_decode(Batch.for_decode_capture(inputs, 3))
    assert meta.index_width == draft_swa_width(cfg) == 64
    rows = [r[:7] for r in meta.swa_indices[:, 0].tolist()]
    window = [20, 21, 22, 23, 28, 29, -1]
    assert rows == [window, window, [24, 25, 26] + [-1] * 4, [24, 25, 26] + [-1] * 4,
                    [-1] * 7, [-1] * 7]
    assert meta.swa_lens.tolist() == [6, 6, 3, 3, 0, 0]
    assert meta.is_valid_token.tolist() == [True] * 4 + [False] * 2
    assert meta.token_to_req_indices.tolist() == [0, 0, 1, 1, 0, 0]
    assert meta.tile_scheds["swaonly"] is not None and meta.tile_scheds["c1a"] is None


def test_a_window_wider_than_its_row_is_refused():
    cfg = ArenaConfig(**{**EXAMPLE_V41, "sliding_window": 63, "max_model_len": 256})
    with pytest.raises(ConfigError, match="does not fit"):
        DraftSWAMetadataBuilder().buffers(cfg)
    assert DraftSWAMetadataBuilder(query_len=1).buffers(cfg)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_builds_match_the_oracle(backend, name):
    cfg, builder, inputs = _world(name, backend)
    width = draft_swa_width(cfg)

    @settings(max_examples=20 if backend == "torch" else 6, suppress_health_check=FIXTURE_OK)
    @given(replayed_steps(cfg, kinds=("uniform_decode",)))
    def check(drawn):
        step, _ = drawn
        rs = [0] * step.num_reqs
        t = step.num_tokens_padded
        meta = builder.build(stage_eager(inputs, step, rs))
        want = v41_replay.draft_rows(cfg, oracle_step(step, rs, padded=True), width, t)
        for got in (meta, None):
            if got is None:
                inputs.copy_to_device(step.num_reqs_padded, t, uniform=True)
                got = builder.build_decode(Batch.for_decode_capture(inputs,
                                                                    step.num_reqs_padded))
            assert got.swa_indices[:, 0].tolist() == want["rows"]
            assert got.swa_lens.tolist() == want["lens"]
            assert got.is_valid_token.tolist() == want["is_valid_token"]
            assert got.token_to_req_indices.tolist() == want["token_to_req"]

    check()
