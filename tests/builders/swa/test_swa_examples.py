"""The worked examples of spec §6.6 (L), §6.7 (M) and §7 (N), exactly, on both backends.

One deliberate difference from the reference: padded and invalid decode tokens get index
rows of -1 (the reference leaves them stale), with length 0 as in the reference.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.support import DEVICE, HostStep, slots_for, stage

from staticattn.arena import ArenaConfig
from staticattn.builders import Batch, make_arena
from staticattn.builders.swa.builder import SparseSWAMetadataBuilder
from staticattn.reference.swa import assert_matches, expected_for_step

BASE = dict(
    device=DEVICE, block_size=256, architecture="deepseek_v4", compress_ratios=(1, 4, 128),
    max_model_len=2048, max_num_seqs=4, max_num_batched_tokens=1024,
)


def _builder(backend: str, **overrides):
    cfg = ArenaConfig(**{**BASE, **overrides, "kernel_backend": backend})
    builder = SparseSWAMetadataBuilder()
    _, inputs = make_arena(cfg, [builder])
    return cfg, builder, inputs


def _step(cfg, query_lens, seq_lens, swa_rows=None, main_rows=None, *, num_reqs_padded=None,
          num_tokens_padded=None) -> HostStep:
    """A step whose block-table rows start with the given blocks (the rest: block 1)."""
    r = len(query_lens)
    swa_bt = np.ones((r, cfg.max_swa_blocks_per_req), dtype=np.int32)
    bt = np.ones((r, cfg.max_blocks_per_req), dtype=np.int32)
    for table, rows in ((swa_bt, swa_rows), (bt, main_rows)):
        for b, row in enumerate(rows or []):
            table[b, : len(row)] = row
    q, L = np.asarray(query_lens, np.int32), np.asarray(seq_lens, np.int32)
    slots = slots_for(swa_bt, cfg.swa_block_size, q, L)
    return HostStep(q, L, slots, bt, swa_bt, num_reqs_padded or r,
                    num_tokens_padded or int(q.sum()))


EXAMPLE_L_ROWS = [
    [29, 30, 31, 8],
    [30, 31, 8, 9],
    [20, 21, -1, -1],
    [20, 21, 22, -1],
    [-1, -1, -1, -1],  # padded: the reference leaves these rows stale
    [-1, -1, -1, -1],
]


@pytest.mark.parametrize("path", ["build", "build_decode"])
def test_example_l_swa_window(backend, path):
    cfg, builder, inputs = _builder(backend, sliding_window=4, swa_block_size=4,
                                    num_speculative_tokens=1)
    # qsl [0, 2, 4], L [6, 3], two padded tokens. build_decode sees them as a third,
    # padded request (query length 0), the captured shape of 3 requests x next_n = 2.
    step = _step(cfg, [2, 2], [6, 3], swa_rows=[[7, 2], [5, 9]],
                 num_reqs_padded=2 if path == "build" else 3, num_tokens_padded=6)
    batch = stage(inputs, step)
    if path == "build":
        meta = builder.build(batch)
    else:
        meta = builder.build_decode(Batch.for_decode_capture(inputs, 3))
    assert meta.decode_swa_indices[:, 0].tolist() == EXAMPLE_L_ROWS
    assert meta.decode_swa_lens.tolist() == [4, 4, 2, 3, 0, 0]
    assert meta.is_valid_token.tolist() == [True] * 4 + [False] * 2
    assert meta.token_to_req_indices.tolist() == [0, 0, 1, 1, 0, 0]
    assert meta.dense_decode_lens.tolist() == [0] * 6  # no complete 128-group yet
    assert (meta.num_decodes, meta.num_prefills, meta.num_decode_tokens) == (
        step.num_reqs_padded, 0, 6)
    assert_matches(meta, expected_for_step(cfg, step))


def test_example_m_prefill_gather_lens(backend):
    cfg, builder, inputs = _builder(backend, sliding_window=128, num_speculative_tokens=1)
    # One decode first, so the prefills start at request 1; then the three cases of §6.7:
    # fresh prefill, chunk continuation, continuation with a short context.
    step = _step(cfg, [1, 50, 500, 100], [700, 50, 1000, 300])
    meta = builder.build(stage(inputs, step))
    assert (meta.num_decodes, meta.num_prefills, meta.num_decode_tokens,
            meta.num_prefill_tokens) == (1, 3, 1, 650)
    assert meta.prefill_seq_lens.tolist() == [50, 1000, 300]
    assert meta.prefill_gather_lens.tolist() == [50, 627, 227]
    assert_matches(meta, expected_for_step(cfg, step))


def test_example_n_c_dense_topk(backend):
    cfg, builder, inputs = _builder(backend, sliding_window=128, num_speculative_tokens=1)
    assert cfg.dense_width == 128 and cfg.block_size // 128 == 2
    # Decode tokens at p = 300 and p = 383, block row [11, 4, 6] (BS = 256, 2 entries/block).
    step = _step(cfg, [1, 1], [301, 384], main_rows=[[11, 4, 6], [11, 4, 6]])
    meta = builder.build(stage(inputs, step))
    rows = meta.dense_decode_indices[:, 0].tolist()
    assert rows[0] == [22, 23] + [-1] * 126
    assert rows[1] == [22, 23, 8] + [-1] * 125
    assert meta.dense_decode_lens.tolist() == [2, 3]
    assert_matches(meta, expected_for_step(cfg, step))
