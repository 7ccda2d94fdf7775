"""The C128A prefill rows, chunk by chunk in a fixed workspace, against the oracle's rows of
one row per prefill token (plain loops from ``vllm-0.33-extras.md`` §5.2): every chunk holds
the slice of those rows that starts at its first row, from the eager build (the step's
``Tp`` rows) and from the mixed build (a bucket's rows, -1 and 0 past the real prefill
tokens), on torch and on Triton (interpreted on CPU); a bad chunk index or workspace size is
a typed error before anything is written."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.mixed_steps import stage_mixed
from helpers.support import DEVICE, fuzz_examples, host_steps, make_step, stage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from staticattn.arena import ArenaConfig
from staticattn.arena.config import cdiv
from staticattn.builders import SparseSWAMetadataBuilder, make_arena
from staticattn.builders.swa.declarations import dense_prefill_chunk_rows
from staticattn.errors import ConfigError, InvalidBatchError
from staticattn.reference import mixed as mixed_oracle
from staticattn.reference.swa import assert_dense_chunks, expected_for_step

#: maxC = 128 (max_model_len 4096 / 128 = 32 entries, rounded up to 128): 512 bytes a row.
SMALL = dict(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=4096,
             num_speculative_tokens=1, device=DEVICE)
ROW_BYTES = 4 * 128
#: Rows per chunk: one row; chunks that end inside a request; one chunk for the bucket.
ROWS = (1, 5, 64)
FIXTURE_OK = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]

_worlds: dict = {}


def world(rows: int, backend: str):
    """``(config, builder, inputs)`` with a workspace of ``rows`` rows (cached per case)."""
    key = (rows, backend)
    if key not in _worlds:
        cfg = ArenaConfig.deepseek_v4(**SMALL, kernel_backend=backend,
                                      dense_prefill_workspace_bytes=rows * ROW_BYTES)
        builder = SparseSWAMetadataBuilder()
        _, inputs = make_arena(cfg, [builder])
        _worlds[key] = cfg, builder, inputs
    return _worlds[key]


def check_eager(cfg, builder, inputs, step) -> None:
    """The eager build's chunks equal the oracle's prefill rows (None without prefills)."""
    meta = builder.build(stage(inputs, step))
    exp = expected_for_step(cfg, step)
    if exp.dense_prefill_indices is None:
        assert meta.dense_prefill is None
        return
    assert meta.dense_prefill.num_chunks == cdiv(exp.num_prefill_tokens,
                                                 dense_prefill_chunk_rows(cfg))
    assert_dense_chunks(meta.dense_prefill, exp.dense_prefill_indices,
                        exp.dense_prefill_lens)


def check_mixed(cfg, builder, inputs, step, num_reqs: int, num_tokens: int) -> None:
    """The mixed build's chunks cover the bucket: the oracle's rows for the real prefill
    tokens, then rows of -1 and length 0, whatever the composition (decode-only too)."""
    meta = builder.build_mixed(stage_mixed(inputs, step, num_reqs, num_tokens))
    exp = mixed_oracle.swa(cfg, step, num_reqs, num_tokens)
    assert meta.dense_prefill.num_chunks == cdiv(num_tokens, dense_prefill_chunk_rows(cfg))
    assert_dense_chunks(meta.dense_prefill, exp["cp_rows"], exp["cp_lens"])


# The steps name where chunk boundaries fall (rows per chunk 1 and 5).
CASES = {
    # One decode (2 tokens), then a prefill of 13 tokens crossing 128 and 256: with 5 rows a
    # chunk, boundaries at prefill rows 5 and 10 fall inside the request; the last chunk
    # holds 3 rows.
    "boundaries-inside-a-request": ([2, 13], [300, 262]),
    # Two prefills, the second starting inside chunk 0 of 5 rows; 7 rows: a partial chunk.
    "partial-last-chunk": ([4, 3], [140, 600]),
    # Padded tokens (slot -1) at the tail are prefill rows too: rows from their positions.
    "padded": ([2, 2, 6], [500, 129, 1000]),
    "decode-only": ([2, 2, 1], [700, 40, 129]),
    "one-long-prefill": ([64], [4096]),
}


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("case", CASES)
def test_chunks_equal_the_oracle_rows_on_named_steps(backend, rows, case):
    cfg, builder, inputs = world(rows, backend)
    assert dense_prefill_chunk_rows(cfg) == rows
    q, s = CASES[case]
    step = make_step(cfg, q, s, invalid_tokens=(sum(q) - 1,) if case == "padded" else (),
                     rng=np.random.default_rng(len(case)))
    check_eager(cfg, builder, inputs, step)
    check_mixed(cfg, builder, inputs, step, 4, 64)
    # A smaller bucket (16 tokens) than the workspace of 64 rows: one chunk, 16 rows.
    if sum(q) <= 16:
        check_mixed(cfg, builder, inputs, step, 4, 16)


@pytest.mark.parametrize("rows", ROWS)
def test_chunks_equal_the_oracle_rows_on_random_steps(backend, rows):
    cfg, builder, inputs = world(rows, backend)

    @settings(max_examples=fuzz_examples(backend, 40, 4), deadline=None,
              suppress_health_check=FIXTURE_OK)
    @given(step=host_steps(cfg, max_reqs=6), tokens=st.sampled_from([16, 32, 64]))
    def check(step, tokens):
        check_eager(cfg, builder, inputs, step)
        if step.num_tokens <= tokens:
            check_mixed(cfg, builder, inputs, step, min(step.num_reqs_padded + 1, 8), tokens)

    check()


def test_a_chunk_is_rewritten_over_the_previous_one(backend):
    """Chunk after chunk in one workspace: a short row after a long one keeps no stale
    entry (the Triton kernel writes only up to the longer length), and a chunk past the
    step's prefill tokens holds rows of -1, length 0."""
    cfg, builder, inputs = world(5, backend)
    step = make_step(cfg, [9], [3000], rng=np.random.default_rng(1))  # positions 2991..2999
    meta = builder.build_mixed(stage_mixed(inputs, step, 2, 16))
    chunks = meta.dense_prefill
    assert chunks.num_chunks == 4
    rows, lens = chunks.write(0)
    assert lens.tolist() == [23] * 5 and rows[:, :23].tolist() == [list(range(23))] * 5
    for c in (2, 3, 1):  # dead, dead, then 4 live rows and a dead one
        rows, lens = chunks.write(c)
        want = [23] * 4 + [0] if c == 1 else [0] * (5 if c == 2 else 1)
        assert lens.tolist() == want
        assert (rows[:, 23:] == -1).all() and (rows[lens == 0] == -1).all()
        assert chunks.first_row(c) == 5 * c


def test_a_bad_chunk_is_refused_before_anything_is_written():
    cfg, builder, inputs = world(5, "torch")
    step = make_step(cfg, [2, 13], [300, 262], rng=np.random.default_rng(0))
    chunks = builder.build(stage(inputs, step)).dense_prefill
    chunks.write(1)
    before = (chunks.indices.clone(), chunks.lens.clone())
    for bad in (-1, chunks.num_chunks, 7, True, 1.0, None):
        with pytest.raises(InvalidBatchError, match=r"not a chunk of this step.*3 chunks"):
            chunks.write(bad)
    assert chunks.indices.equal(before[0]) and chunks.lens.equal(before[1])


def test_the_chunks_are_made_once_per_split():
    cfg, builder, inputs = world(5, "torch")
    step = make_step(cfg, [2, 13], [300, 262], rng=np.random.default_rng(0))
    chunks = builder.build(stage(inputs, step)).dense_prefill
    assert builder.build(stage(inputs, step)).dense_prefill is chunks


@pytest.mark.parametrize("bad", [0, -4096, True, 1.5, "16MiB", None])
def test_a_bad_workspace_size_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="dense_prefill_workspace_bytes"):
        ArenaConfig.deepseek_v4(**SMALL, dense_prefill_workspace_bytes=bad)


def test_the_workspace_rows_follow_the_budget():
    """At least one row (a budget below one row still gets one), at most a step's tokens;
    0 without a type that reads every entry."""
    rows = {b: dense_prefill_chunk_rows(ArenaConfig.deepseek_v4(
        **SMALL, dense_prefill_workspace_bytes=b)) for b in (
        1, ROW_BYTES - 1, ROW_BYTES, 3 * ROW_BYTES + 7, 64 * ROW_BYTES, 1 << 30)}
    assert rows == {1: 1, ROW_BYTES - 1: 1, ROW_BYTES: 1, 3 * ROW_BYTES + 7: 3,
                    64 * ROW_BYTES: 64, 1 << 30: 64}
    assert dense_prefill_chunk_rows(ArenaConfig.deepseek_v32(device=DEVICE)) == 0
