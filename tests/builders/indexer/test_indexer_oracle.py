"""The indexer builder against the plain-loop oracle on random realistic steps: every field in
its valid region, for next_n 1-4 and 8, index compress ratio 1 and 4, block sizes 64 and 256, the
eager build (decode, mixed with chunked prefills, prefill) and the graph-safe decode build
(padded and unpadded uniform batches), torch natively and Triton interpreted.

One arena serves all examples of a test, so any value left over from an earlier step that
leaked into a later one would show up as a mismatch."""

from __future__ import annotations

import pytest
from helpers.support import DEVICE, host_steps, index_ratio_fields, stage
from hypothesis import given, settings

from staticattn.arena import ArenaConfig
from staticattn.builders import Batch, make_arena
from staticattn.builders.indexer.builder import IndexerMetadataBuilder
from staticattn.reference import indexer as oracle

GRID = [(n, ratio, bs) for n in (1, 2, 3, 4, 8) for ratio in (1, 4) for bs in (64, 256)]
GRID_IDS = [f"n{n}-R{ratio}-bs{bs}" for n, ratio, bs in GRID]

# Interpreted Triton is slow: fewer examples there; torch covers the space.
EAGER_EXAMPLES = {"torch": 60, "triton": 15}
DECODE_EXAMPLES = {"torch": 30, "triton": 8}


def _config(backend, n, ratio, block_size):
    return ArenaConfig(
        max_num_seqs=16, max_num_batched_tokens=256, max_model_len=4096,
        block_size=block_size, num_speculative_tokens=n - 1, **index_ratio_fields(ratio),
        num_sms=7 if ratio == 1 else 20,
        # Small budgets so prefills split into chunks and query sub-chunks.
        max_prefill_workspace=1500, max_logits_bytes=4 * 12_000,
        device=DEVICE, kernel_backend=backend,
    )


@pytest.mark.parametrize(("n", "ratio", "block_size"), GRID, ids=GRID_IDS)
def test_eager_build_matches_oracle(backend, n, ratio, block_size):
    cfg = _config(backend, n, ratio, block_size)
    builder = IndexerMetadataBuilder()
    arena, inputs = make_arena(cfg, [builder])

    @settings(max_examples=EAGER_EXAMPLES[backend])
    @given(host_steps(cfg))
    def check(step):
        meta = builder.build(stage(inputs, step))
        oracle.assert_matches(meta, oracle.indexer_metadata(cfg, step), step, arena)

    check()


@pytest.mark.parametrize(("n", "ratio", "block_size"), GRID, ids=GRID_IDS)
def test_decode_build_matches_oracle_and_eager(backend, n, ratio, block_size):
    cfg = _config(backend, n, ratio, block_size)
    builder = IndexerMetadataBuilder()
    arena, inputs = make_arena(cfg, [builder])

    @settings(max_examples=DECODE_EXAMPLES[backend])
    @given(host_steps(cfg, kinds=("uniform_decode",)))
    def check(step):
        batch = stage(inputs, step)
        meta = builder.build_decode(Batch.for_decode_capture(inputs, step.num_reqs_padded))
        oracle.assert_matches(meta, oracle.indexer_metadata(cfg, step, graph=True), step, arena)
        captured = oracle.decode_values(meta)
        eager = builder.build(batch)
        oracle.assert_matches(eager, oracle.indexer_metadata(cfg, step), step, arena)
        assert oracle.decode_values(eager) == captured

    check()

