"""Every worked example of spec §4 through the indexer builder (eager build and, for uniform
decodes, the graph-safe decode build), on the torch and Triton backends."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.support import DEVICE, index_ratio_fields, make_step, stage

from staticattn.arena import ArenaConfig
from staticattn.builders import Batch, make_arena
from staticattn.builders.indexer.builder import IndexerMetadataBuilder
from staticattn.reference import indexer as oracle


def _setup(backend, legacy=False, **overrides):
    fields = dict(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=4096,
                  block_size=64, num_sms=4, device=DEVICE, kernel_backend=backend)
    fields.update(overrides)
    cfg = ArenaConfig(**fields)
    builder = IndexerMetadataBuilder(legacy_schedule=legacy)
    arena, inputs = make_arena(cfg, [builder])
    return cfg, builder, arena, inputs


def _build(backend, query_lens, seq_lens, rows=None, pad=None, pad_tokens=None, graph=False,
           legacy=False, **overrides):
    """Stage a step (block-table rows given or random), build, check against the oracle."""
    cfg, builder, arena, inputs = _setup(backend, legacy, **overrides)
    n = cfg.next_n
    if pad is not None and pad_tokens is None:
        pad_tokens = pad * n
    step = make_step(cfg, query_lens, seq_lens, num_reqs_padded=pad, num_tokens_padded=pad_tokens)
    for b, row in enumerate(rows or []):
        step.block_table[b, : len(row)] = row
    batch = stage(inputs, step)
    if graph:
        meta = builder.build_decode(Batch.for_decode_capture(inputs, step.num_reqs_padded))
    else:
        meta = builder.build(batch)
    oracle.assert_matches(meta, oracle.indexer_metadata(cfg, step, graph=graph, legacy=legacy),
                          step, arena)
    return meta


def _chunks(meta):
    return [(c.num_reqs, c.token_start, c.token_end, c.total_seq_lens, c.skip_kv_gather)
            for c in meta.prefill.chunks]


def test_a_compressed_slots_use_the_storage_block_size(backend):
    meta = _build(backend, [40], [280], rows=[[5, 7]], block_size=256, **index_ratio_fields(4))
    slots = meta.slot_mapping.tolist()
    assert len(slots) == 40
    assert [s for s in slots if s >= 0] == [5 * 64 + k for k in range(60, 64)] + [
        7 * 64 + k for k in range(6)]
    assert meta.num_prefills == 1 and meta.decode is None


def test_b_compressed_slots_two_requests(backend):
    meta = _build(backend, [10, 3], [10, 9], rows=[[3], [8]], block_size=256,
                  **index_ratio_fields(4))
    assert meta.slot_mapping.tolist() == [-1, -1, -1, 192, -1, -1, -1, 193, -1, -1, -1, 513, -1]


def test_c_chunks_bounded_by_the_logits_budget(backend):
    meta = _build(backend, [5, 5, 5], [10, 10, 10], max_prefill_workspace=100,
                  max_logits_bytes=1000)
    assert _chunks(meta) == [(2, 0, 10, 20, False), (1, 10, 15, 10, False)]
    first, second = meta.prefill.chunks
    assert first.cu_seq_lens.tolist() == [0, 10, 20]
    assert first.cu_seqlen_ks.tolist() == [0] * 5 + [10] * 5
    assert first.cu_seqlen_ke.tolist() == [6, 7, 8, 9, 10, 16, 17, 18, 19, 20]
    assert second.cu_seq_lens.tolist() == [0, 10]


def test_d_query_sub_chunks_after_decodes(backend):
    meta = _build(backend, [1, 1, 100, 40, 300], [50, 60, 100, 40, 3000],
                  max_prefill_workspace=4000, max_logits_bytes=800_000)
    assert (meta.num_decodes, meta.num_prefills) == (2, 3)
    assert _chunks(meta) == [
        (2, 2, 142, 140, False),
        (1, 142, 208, 3000, False),
        (1, 208, 274, 3000, True),
        (1, 274, 340, 3000, True),
        (1, 340, 406, 3000, True),
        (1, 406, 442, 3000, True),
    ]
    # The sub-chunks of request 4 share its prefix sums; the ranges do not overlap.
    views = [c.cu_seq_lens for c in meta.prefill.chunks]
    assert len({v.data_ptr() for v in views[1:]}) == 1
    assert views[0].data_ptr() + 3 * 4 <= views[1].data_ptr()


def test_e_prefill_chunk_metadata(backend):
    cfg, builder, arena, inputs = _setup(backend, block_size=256, **index_ratio_fields(4))
    batch = stage(inputs, make_step(cfg, [12, 3], [12, 10]))
    whole = builder.build_prefill_chunk(batch, 0, 2)
    assert whole.cu_seq_lens.tolist() == [0, 3, 5]
    assert whole.total_seq_lens == 5
    assert whole.cu_seqlen_ks.tolist() == [0] * 12 + [3] * 3
    assert whole.cu_seqlen_ke.tolist() == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 5, 5, 5]
    assert (whole.token_start, whole.token_end, whole.skip_kv_gather) == (0, 15, False)
    part = builder.build_prefill_chunk(batch, 0, 2, query_slice=slice(4, 12))
    assert part.cu_seqlen_ks.tolist() == [0] * 8
    assert part.cu_seqlen_ke.tolist() == [1, 1, 1, 2, 2, 2, 2, 3]
    assert (part.token_start, part.token_end, part.skip_kv_gather) == (4, 12, True)
    assert builder.build_prefill_chunk(batch, 0, 1, query_slice=slice(0, 3)).token_end == 3


def test_e_through_the_builder_sub_chunks(backend):
    # E = 12 logits: request A (12 x 3) exceeds it alone -> 4-query sub-chunks; B fits.
    meta = _build(backend, [12, 3], [12, 10], block_size=256, **index_ratio_fields(4),
                  max_logits_bytes=48)
    assert _chunks(meta) == [(1, 0, 4, 3, False), (1, 4, 8, 3, True), (1, 8, 12, 3, True),
                             (1, 12, 15, 2, False)]
    assert [c.cu_seqlen_ke.tolist() for c in meta.prefill.chunks] == [
        [0, 0, 0, 1], [1, 1, 1, 2], [2, 2, 2, 3], [2, 2, 2]]


def test_f_flatten_variable_lengths(backend):
    meta = _build(backend, [3, 1, 4], [10, 7, 12], pad=4, pad_tokens=8, num_speculative_tokens=3)
    assert meta.decode.seq_lens.tolist() == [[8], [9], [10], [7], [9], [10], [11], [12]]
    assert meta.decode.decode_lens.tolist() == [1] * 8
    assert not meta.decode.requires_padding


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize(("ratio", "lens"), [
    (1, [7, 8, 9, 10, 4, 5, 6, 7, 9, 10, 11, 12, 0, 0, 0, 0]),
    (4, [1, 2, 2, 2, 1, 1, 1, 1, 2, 2, 2, 3, 0, 0, 0, 0]),
])
def test_g_flatten_with_graph_padding(backend, graph, ratio, lens):
    meta = _build(backend, [4, 4, 4], [10, 7, 12], pad=4, graph=graph,
                  num_speculative_tokens=3, block_size=256, **index_ratio_fields(ratio))
    assert meta.decode.seq_lens.tolist() == [[x] for x in lens]
    table = meta.decode.block_table.tolist()
    assert table[12:] == [[0] * len(table[0])] * 4, "padded rows are the null block, whole"
    assert meta.slot_mapping.shape == (16,)


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize(("ratio", "lens"), [
    (1, [[9, 10], [6, 7], [11, 12], [0, 0]]),  # the reference leaves [-1, 0]
    (4, [[2, 2], [1, 1], [2, 3], [0, 0]]),
])
def test_h_native_mtp_with_graph_padding(backend, graph, ratio, lens):
    meta = _build(backend, [2, 2, 2], [10, 7, 12], pad=4, graph=graph, legacy=True,
                  num_speculative_tokens=1, block_size=256, **index_ratio_fields(ratio))
    assert meta.decode.seq_lens.tolist() == lens
    assert meta.decode.decode_lens.tolist() == [2, 2, 2, 0]
    assert meta.decode.requires_padding is (not graph)
    if ratio == 1:
        assert meta.decode.schedule_metadata.tolist() == [[0, 0], [1, 0], [2, 0], [4, 0], [4, 0]]


@pytest.mark.parametrize("graph", [False, True])
def test_i_plain_decode_compressed(backend, graph):
    meta = _build(backend, [1, 1, 1], [10, 7, 12], pad=4, graph=graph, block_size=256,
                  **index_ratio_fields(4))
    assert meta.decode.seq_lens.tolist() == [[2], [1], [3], [0]]
    assert meta.decode.decode_lens.tolist() == [1, 1, 1, 0]


@pytest.mark.parametrize(("lens", "pad", "legacy", "want"), [
    ([300, 100], 3, True, [[0, 0], [0, 1], [1, 0], [3, 0], [3, 0]]),  # third row: padding
    ([1000, 600, 10], None, True, [[0, 0], [0, 2], [1, 0], [1, 2], [3, 0]]),
    ([1000, 300, 2100], None, False, [[0, 0], [0, 3], [2, 1], [2, 5], [3, 0]]),  # v2.6.1
])
def test_j_schedule_through_the_builder(backend, lens, pad, legacy, want):
    meta = _build(backend, [1] * len(lens), lens, pad=pad, legacy=legacy)
    assert meta.decode.schedule_metadata.tolist() == want


def test_native_mtp_shorter_than_next_n_is_contiguous(backend):
    # Spec §11 item 2: every decode accepted 1 token of next_n = 2 -> (D, 1), contiguous.
    meta = _build(backend, [1, 1, 1], [10, 7, 12], num_speculative_tokens=1)
    assert meta.decode.seq_lens.shape == (3, 1) and meta.decode.seq_lens.is_contiguous()
    assert np.array_equal(meta.decode.seq_lens.cpu().numpy().ravel(), [10, 7, 12])
