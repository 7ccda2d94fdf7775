"""The sparse SWA + C128A builder under decode context parallelism: replicated. Every rank's
metadata equals the single-GPU oracle (``oracle/swa.py``; the dense page of a rank spans a
DCP block-table column) and every rank's equals every other's, for the eager, decode and
mixed builds, world sizes 2 and 4."""

from __future__ import annotations

import pytest
from helpers.mixed_steps import stage_mixed
from helpers.support import DEVICE, host_steps, stage
from hypothesis import given, settings

from staticattn.arena import ArenaConfig
from staticattn.builders import Batch, make_arena
from staticattn.builders.swa.builder import SparseSWAMetadataBuilder
from staticattn.reference import mixed as mixed_oracle
from staticattn.reference.swa import assert_matches, expected_for_step

V4 = dict(device=DEVICE, max_num_seqs=8, max_num_batched_tokens=256, max_model_len=4096,
          sliding_window=16, swa_block_size=16, architecture="deepseek_v4",
          compress_ratios=(1, 4, 128), block_size=256, num_speculative_tokens=1)
GRID = [(2, 4), (4, 64)]  # (world, interleave)
EXAMPLES = {"torch": 40, "triton": 8}


def _ranks(backend, world, interleave):
    out = []
    for rank in range(world):
        cfg = ArenaConfig(**V4, dcp_world_size=world, dcp_rank=rank,
                          cp_kv_cache_interleave_size=interleave, kernel_backend=backend)
        builder = SparseSWAMetadataBuilder()
        _, inputs = make_arena(cfg, [builder])
        out.append((cfg, builder, inputs))
    return out


def _values(meta) -> list:
    names = ("is_valid_token", "decode_swa_indices", "decode_swa_lens", "dense_decode_indices",
             "dense_decode_lens", "prefill_gather_lens")
    values = [None if getattr(meta, n) is None else getattr(meta, n).tolist() for n in names]
    chunks = meta.dense_prefill  # the dense prefill rows, every chunk written in turn
    return values + [None if chunks is None else [
        [view.tolist() for view in chunks.write(c)] for c in range(chunks.num_chunks)]]


@pytest.mark.parametrize(("world", "interleave"), GRID)
@pytest.mark.parametrize("build", ["build", "build_decode"])
def test_every_rank_holds_the_single_gpu_metadata(backend, world, interleave, build):
    ranks = _ranks(backend, world, interleave)
    kinds = ("uniform_decode",) if build == "build_decode" else ("decode", "mixed", "prefill")

    @settings(max_examples=EXAMPLES[backend])
    @given(host_steps(ranks[0][0], kinds=kinds, max_reqs=8))
    def check(step):
        values = []
        for cfg, builder, inputs in ranks:
            batch = stage(inputs, step)
            if build == "build_decode":
                batch = Batch.for_decode_capture(inputs, step.num_reqs_padded)
            meta = getattr(builder, build)(batch)
            assert_matches(meta, expected_for_step(cfg, step))
            values.append(_values(meta))
        assert all(v == values[0] for v in values)

    check()


@pytest.mark.parametrize(("world", "interleave"), GRID)
def test_mixed_build_is_replicated(backend, world, interleave):
    """Staged for the bucket (8 requests, 256 tokens) as a mixed graph stages it: every
    rank equals the mixed-build oracle over the bucket's whole extent, and every other."""
    ranks = _ranks(backend, world, interleave)

    @settings(max_examples=EXAMPLES[backend])
    @given(host_steps(ranks[0][0], max_reqs=8))
    def check(step):
        values = []
        for cfg, builder, inputs in ranks:
            meta = builder.build_mixed(stage_mixed(inputs, step, 8, 256))
            mixed_oracle.assert_swa_matches(meta, mixed_oracle.swa(cfg, step, 8, 256), cfg,
                                            step)
            values.append(_values(meta))
        assert all(v == values[0] for v in values)

    check()
