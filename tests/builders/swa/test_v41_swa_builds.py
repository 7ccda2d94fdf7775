"""Hypothesis: the SWA builder's eager, decode and mixed builds against the oracles, for
small capacities of the V4 and V4.1-Flash preset shapes, on both kernel backends.

Steps of every kind (MTP decodes, extends, fresh prefills, slot -1 tokens, replay starts on
prefill requests and stale ones on decodes) are staged eagerly or for a token bucket; every
field is compared -- the existing ones with ``staticattn.reference.swa`` / ``.mixed`` (gather
lengths with the replay clamp), the paged prefill rows, replay starts and chunk plans with
``staticattn.reference.v41_swa``, and each windowed type's combined and FlashInfer rows,
built from random top-k rows, with ``staticattn.reference.v41_rows``. One arena per (config,
backend) serves every example, so a row left stale by an earlier example would fail a later one.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from helpers.mixed_steps import bucket_for
from helpers.support import DEVICE
from helpers.v41_swa_steps import CONFIGS, oracle_step, replayed_steps, stage_bucket, stage_eager
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from staticattn.builders import Batch, make_arena
from staticattn.builders.swa.builder import SparseSWAMetadataBuilder
from staticattn.builders.swa.declarations import topk_columns
from staticattn.model import Reads
from staticattn.reference import mixed as mixed_oracle
from staticattn.reference import swa as swa_oracle
from staticattn.reference import v41_rows, v41_swa

FIXTURE_OK = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


def _examples(backend: str) -> int:
    return 25 if backend == "torch" else 8


@functools.cache
def _world(name: str, backend: str):
    cfg = CONFIGS[name](kernel_backend=backend)
    builder = SparseSWAMetadataBuilder()
    _, inputs = make_arena(cfg, [builder])
    return cfg, builder, inputs


def _replay(cfg, rs):
    return rs if cfg.bounded_replay else [0] * len(rs)


def _random_topk(cfg, rng, num_tokens: int, k: int) -> torch.Tensor:
    """Top-k rows by token: mostly small local indices, some -1, some past any N."""
    rows = rng.integers(-1, 48, size=(num_tokens, max(k, 1)), dtype=np.int32)
    return torch.from_numpy(rows[:, :k] if k else rows[:, :0]).to(DEVICE)


def _check_rows(cfg, builder, meta, o_step, rng, rows_combined: int, rows_flash: int,
                real_reqs: int | None = None) -> None:
    """Every windowed type's combined and FlashInfer rows against the oracle."""
    t = meta.slot_mapping.shape[0]
    for lt in cfg.layer_types:
        if not lt.window:
            continue
        k = topk_columns(cfg, lt)
        topk = _random_topk(cfg, rng, t, k) if lt.reads is Reads.TOPK else None
        rows, lens = builder.prefill_combined_rows(meta, lt.name, topk)
        want = v41_rows.combined(cfg, o_step, lt, None if topk is None else topk.tolist(), k,
                                 rows_combined, real_reqs)
        assert rows.tolist() == want[0], lt.name
        assert lens.tolist() == want[1], lt.name
        if lt.reads is Reads.ALL:
            continue
        table = torch.from_numpy(rng.integers(1, 1000, size=(meta.seq_lens.shape[0], 64),
                                              dtype=np.int32)).to(DEVICE)
        rows, lens = builder.flashinfer_rows(meta, lt.name, topk,
                                             compressed_block_table=table)
        want = v41_rows.flashinfer(cfg, o_step, lt, None if topk is None else topk.tolist(),
                                   table.tolist(), k, rows_flash, real_reqs)
        assert rows.tolist() == want[0], lt.name
        assert lens.tolist() == want[1], lt.name


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_eager_build_matches_the_oracles(backend, name):
    cfg, builder, inputs = _world(name, backend)

    @settings(max_examples=_examples(backend), suppress_health_check=FIXTURE_OK)
    @given(replayed_steps(cfg, kinds=("uniform_decode", "decode", "mixed", "prefill")),
           st.integers(0, 2**31))
    def check(drawn, seed):
        step, rs = drawn
        rs = _replay(cfg, rs)
        meta = builder.build(stage_eager(inputs, step, rs))
        o_step = oracle_step(step, rs, padded=True)
        exp = v41_swa.expected_eager(cfg, o_step)
        old = swa_oracle.expected_for_step(cfg, step)
        old.prefill_gather_lens = exp.get("prefill_gather_lens")
        swa_oracle.assert_matches(meta, old)
        v41_swa.assert_eager(meta, exp)
        _check_rows(cfg, builder, meta, o_step, np.random.default_rng(seed),
                    meta.num_prefill_tokens if meta.num_prefills else 0,
                    step.num_tokens_padded)

    check()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_mixed_build_matches_the_oracles(backend, name):
    cfg, builder, inputs = _world(name, backend)

    @settings(max_examples=_examples(backend), suppress_health_check=FIXTURE_OK)
    @given(replayed_steps(cfg, kinds=("decode", "mixed", "prefill")), st.integers(0, 2**31))
    def check(drawn, seed):
        step, rs = drawn
        rs = _replay(cfg, rs)
        rng = np.random.default_rng(seed)
        num_reqs, num_tokens = bucket_for(cfg, step.num_tokens, rng)
        meta = builder.build_mixed(stage_bucket(inputs, step, rs, num_reqs, num_tokens))
        mixed_exp = mixed_oracle.swa(cfg, step, num_reqs, num_tokens)
        o_step = oracle_step(step, rs, padded=False)
        exp = v41_swa.expected_mixed(cfg, o_step, num_reqs, num_tokens)
        mixed_exp["gather_lens"] = exp["prefill_gather_lens"]
        mixed_oracle.assert_swa_matches(meta, mixed_exp, cfg, step)
        v41_swa.assert_mixed(meta, exp)
        assert meta.split_on_device
        _check_rows(cfg, builder, meta, o_step, rng, num_tokens, num_tokens, step.num_reqs)

    check()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_decode_build_carries_no_prefill_rows(backend, name):
    """A uniform decode graph's build: no replay starts (every request decodes), no prefill
    rows, no plans; the decode rows as the oracle's."""
    cfg, builder, inputs = _world(name, backend)

    @settings(max_examples=_examples(backend) // 2 + 1, suppress_health_check=FIXTURE_OK)
    @given(replayed_steps(cfg, kinds=("uniform_decode",)))
    def check(drawn):
        step, _ = drawn
        stage_eager(inputs, step, [0] * step.num_reqs)
        inputs.copy_to_device(step.num_reqs_padded, step.num_tokens_padded, uniform=True)
        meta = builder.build_decode(Batch.for_decode_capture(inputs, step.num_reqs_padded))
        swa_oracle.assert_matches(meta, swa_oracle.expected_for_step(cfg, step))
        assert meta.replay_start is None and meta.prefill_swa_indices is None
        assert meta.prefill_chunk_plans == {}
        rows, lens = builder.prefill_combined_rows(meta, "swaonly")
        assert rows.shape[0] == lens.shape[0] == 0

    check()
