"""The gather consumer on DeepSeek V4.1: its eight columns (window, C128A, an indexer column
per index type, a read and a write column per kv-source type) equal the oracle's
(``staticattn.reference.checksums.expected_v41``, from the step and the group tables alone)
whichever build made the metadata: the eager build, the uniform decode build, the mixed
build of a token bucket."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.gather_world import consume
from helpers.mixed_steps import bucket_for
from helpers.support import fuzz_examples
from helpers.v41_steps import (
    CONFIGS,
    make_v41_step,
    stage_mixed_v41,
    stage_v41,
    v41_config,
    v41_steps,
)
from hypothesis import given, settings

from staticattn.builders import Batch, default_builders, make_arena
from staticattn.consumers import GatherConsumer
from staticattn.reference import checksums
from staticattn.reference.v41_compressed import V41Step

COLUMNS = ["swa", "dense", "indexer.c1a", "indexer.c2a", "c1a.read", "c1a.write", "c2a.read",
           "c2a.write"]


def world(name: str, backend: str):
    cfg = v41_config(name, backend)
    builders = default_builders(cfg)
    _, inputs = make_arena(cfg, builders)
    consumer = GatherConsumer(cfg, num_kv_blocks=100_000)
    caches = {k: v.cpu().tolist() for k, v in consumer.caches.items()}
    return cfg, builders, inputs, consumer, caches


def test_the_columns_name_the_v41_outputs():
    cfg, _, _, consumer, caches = world("flash-n2", "torch")
    assert consumer.columns == COLUMNS
    assert sorted(caches) == sorted(["swa", "dense", "indexer.c1a", "indexer.c2a",
                                     "c1a.compressed_kv", "c2a.compressed_kv",
                                     "c2a.compressor_state"])
    # Pages of S = block_size // R entries per type; the ring: 8 rows per request.
    assert len(caches["c2a.compressed_kv"]) == 100_000 * cfg.block_size // 2
    assert len(caches["c2a.compressor_state"]) == 100_000 * 8


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_v41_checksums_match_the_oracle_through_every_build(backend, name):
    cfg, builders, inputs, consumer, caches = world(name, backend)

    # Interpreted Triton: one step a config on CPU (each costs about 8 s); the torch backend
    # draws 20 over the same strategy, and the GPU suite 20 on both.
    @settings(max_examples=fuzz_examples(backend, 20, 1))
    @given(v41_steps(cfg, max_seq_len=4096))
    def check(v41):
        step = v41.step
        want = checksums.expected_v41(cfg, v41, caches, step.num_tokens_padded)
        assert consume(consumer, builders, stage_v41(inputs, v41), "build") == want
        num_reqs, num_tokens = bucket_for(cfg, step.num_tokens,
                                          np.random.default_rng(step.num_tokens))
        got = consume(consumer, builders, stage_mixed_v41(inputs, v41, num_reqs, num_tokens),
                       "build_mixed")
        assert got == checksums.expected_v41(cfg, v41, caches, num_tokens)
        if (step.query_lens == cfg.next_n).all():
            stage_v41(inputs, v41)
            inputs.copy_to_device(step.num_reqs_padded, step.num_tokens_padded, uniform=True)
            batch = Batch.for_decode_capture(inputs, step.num_reqs_padded)
            assert consume(consumer, builders, batch, "build_decode") == want

    check()


def test_a_replayed_window_past_the_table_reads_nothing_outside_it(backend):
    """A prefill's window starts at its replay start, so near max_model_len it reaches
    positions past the SWA table's last column (4096 here: 3969 + 127). Those positions are
    masked out, and neither backend may index the table with them (on CUDA the torch
    backend's gather would be a device-side assert, not an IndexError)."""
    cfg, builders, inputs, consumer, caches = world("flash-bs128-n4", backend)
    assert cfg.max_swa_blocks_per_req * cfg.swa_block_size == 4096
    v41 = make_v41_step(cfg, [5, 5, 5], [6, 6, 3974])
    v41 = V41Step(v41.step, v41.tables, replay_start=[0, 0, 3969])
    want = checksums.expected_v41(cfg, v41, caches, v41.step.num_tokens_padded)
    assert any(row[0] for row in want[10:])
    assert consume(consumer, builders, stage_v41(inputs, v41), "build") == want


def test_a_missing_compressed_build_leaves_its_columns_zero():
    """Without the compressed builder in the metadata its four columns are 0, not stale."""
    cfg, builders, inputs, consumer, _ = world("flash-n2", "torch")
    v41 = make_v41_step(cfg, [2, 2, 40], [300, 77, 40])
    batch = stage_v41(inputs, v41)
    full = consume(consumer, builders, batch, "build")
    assert any(row[4] for row in full)
    partial = consumer(batch, {b.name: b.build(batch) for b in builders
                               if b.name != "compressed"}).tolist()
    assert [row[:4] for row in partial] == [row[:4] for row in full]
    assert all(row[4:] == [0, 0, 0, 0] for row in partial)
