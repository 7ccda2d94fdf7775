"""The worked examples of ``docs/spec/deepseek-v41.md`` §11, cases 1-4, as exact tests of the
fields the compressed builder and the two indexers own (case 4, bounded replay: the
compressed and index-K slots): compressed slots (c1a, c2a), index-K
slots, ring slots, entry counts, indexer decode lengths (varlen and native), prefill key
ranges, and the decode operand from a local top-k; eager and graph-safe builds, both kernel
backends.

Geometry (§11): window 4 on 4-token SWA pages, compressed and index-K block ``BS = 8`` (c1a
``S = 8``, c2a ``S = 4``), top-4, ring capacity 8, ratios {0, 2, 1}. Tables the spec gives
are used as given; c1a's are the ones its group slots imply (``[24..28]``: row ``[3]``;
``[40..48]``: ``[5, 6]``), and c1a's index-K table, which the spec does not give, is chosen.

Case 4's SWA rows are ``tests/builders/swa/test_v41_swa_examples.py``'s.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.support import DEVICE, HostStep, slots_for, stage

from staticattn.arena import ArenaConfig
from staticattn.builders import Batch, default_builders, make_arena

INT = np.int32


def _config(backend: str, num_spec: int = 0, **kw) -> ArenaConfig:
    return ArenaConfig(
        architecture="deepseek_v41", compress_ratios=(0, 2, 1), sliding_window=4,
        swa_block_size=4, block_size=8, index_topk=4, num_speculative_tokens=num_spec,
        max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64, num_sms=4,
        device=DEVICE, kernel_backend=backend, **kw)


def _world(backend: str, num_spec: int = 0, **kw):
    cfg = _config(backend, num_spec, **kw)
    builders = {b.name: b for b in default_builders(cfg)}
    arena, inputs = make_arena(cfg, list(builders.values()))
    return cfg, builders, inputs


def _stage(cfg, inputs, query_lens, seq_lens, tables, pad_reqs=None, pad_tokens=None,
           replay_start=None):
    """Write the group tables (rows as given, zero-padded), stage the step with SWA slots."""
    r = len(query_lens)
    swa = np.arange(1, 1 + r * cfg.max_swa_blocks_per_req, dtype=INT).reshape(r, -1)
    step = HostStep(np.asarray(query_lens, INT), np.asarray(seq_lens, INT),
                    slots_for(swa, cfg.swa_block_size, query_lens, seq_lens),
                    np.ones((r, cfg.max_blocks_per_req), INT), swa,
                    pad_reqs or r, pad_tokens or int(sum(query_lens)))
    for name, rows in tables.items():
        view = inputs.block_tables[name]
        view.zero_()
        for b, row in enumerate(rows):
            view[b, : len(row)] = torch.tensor(row, dtype=torch.int32)
    return step, stage(inputs, step, None if replay_start is None else np.asarray(replay_start))


CASE1_TABLES = {
    "c1a.compressed_kv": [[3], [5, 6]], "c1a.index_k": [[4], [7, 9]],
    "c2a.compressed_kv": [[11, 0], [12, 16]], "c2a.index_k": [[31, 0], [32, 36]],
    "c2a.compressor_state": [[1], [2]],
}


@pytest.mark.parametrize("mixed", [False, True])
def test_case1_two_fresh_prefills(backend, mixed):
    cfg, b, inputs = _world(backend)
    _, batch = _stage(cfg, inputs, [5, 9], [5, 9], CASE1_TABLES)
    if mixed:
        batch = Batch.for_mixed_capture(inputs, 2, 14)
    build = (lambda x: x.build_mixed(batch)) if mixed else (lambda x: x.build(batch))
    kv = build(b["compressed"]).types
    assert kv["c1a"].slot_mapping.tolist() == list(range(24, 29)) + list(range(40, 49))
    assert kv["c2a"].slot_mapping.tolist() == [-1, 44, -1, 45, -1,
                                               -1, 48, -1, 49, -1, 50, -1, 51, -1]
    assert kv["c2a"].ring_slot_mapping.tolist() == list(range(8, 13)) + list(range(16, 24)) + [16]
    assert kv["c1a"].ring_slot_mapping is None
    assert kv["c1a"].entry_counts.tolist() == list(range(1, 6)) + list(range(1, 10))
    assert kv["c2a"].entry_counts.tolist() == [0, 1, 1, 2, 2, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    c1a, c2a = build(b["indexer.c1a"]), build(b["indexer.c2a"])
    # c1a's index K is the group's own slot of every token (row [4]; [7, 9]).
    assert c1a.slot_mapping.tolist() == list(range(32, 37)) + list(range(56, 64)) + [72]
    assert c2a.slot_mapping.tolist() == [-1, 124, -1, 125, -1,
                                         -1, 128, -1, 129, -1, 130, -1, 131, -1]
    for meta, ks, ke, cu in (
            (c1a, [0] * 5 + [5] * 9, [1, 2, 3, 4, 5] + list(range(6, 15)), [0, 5, 14]),
            (c2a, [0] * 5 + [2] * 9, [0, 1, 1, 2, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6], [0, 2, 6])):
        assert meta.decode is None or mixed
        if mixed:
            plan = meta.prefill.plan
            assert plan.cu_seqlen_ks.tolist() == ks and plan.cu_seqlen_ke.tolist() == ke
            assert plan.cu_seq_lens[:3].tolist() == cu and plan.num_chunks.tolist() == [1]
        else:
            (chunk,) = meta.prefill.chunks
            assert chunk.cu_seqlen_ks.tolist() == ks and chunk.cu_seqlen_ke.tolist() == ke
            assert chunk.cu_seq_lens.tolist() == cu and chunk.total_seq_lens == cu[-1]


CASE2_TABLES = {
    **CASE1_TABLES, "c2a.compressed_kv": [[11, 0], [12, 13]],
}
C1A_TOPK = [[5, 0, 3, -1], [9, 8, 2, 0], [-1] * 4, [-1] * 4]
C2A_TOPK = [[0, 1, 2, -1], [4, 3, 0, 1], [-1] * 4, [-1] * 4]


def _case2(backend, num_spec):
    cfg, b, inputs = _world(backend, num_spec)
    _stage(cfg, inputs, [1, 1], [6, 10], CASE2_TABLES, pad_reqs=4, pad_tokens=4)
    return b, inputs


def _check_case2_compressed(meta):
    kv = meta.types
    assert kv["c1a"].slot_mapping.tolist() == [29, 49, -1, -1]
    assert kv["c2a"].slot_mapping.tolist() == [46, 52, -1, -1]
    # The reference's FULL graph gives the padded tokens request 0's slot [.., 8, 8] (§5.3).
    assert kv["c2a"].ring_slot_mapping.tolist() == [13, 17, -1, -1]
    assert kv["c1a"].entry_counts.tolist() == [6, 10, 0, 0]
    for name, topk, rows, lens in (
            ("c1a", C1A_TOPK, [[29, 24, 27, -1], [49, 48, 42, 40]], [3, 4, 0, 0]),
            ("c2a", C2A_TOPK, [[44, 45, 46, -1], [52, 51, 48, 49]], [3, 4, 0, 0])):
        topk = torch.tensor(topk, dtype=torch.int32, device=DEVICE)
        indices, got_lens = meta.decode_topk(name, topk)
        assert indices[:, 0].tolist() == rows + [[-1] * 4] * 2
        assert got_lens.tolist() == lens


def test_case2_decode_graph_native(backend):
    """A uniform decode graph of 4 requests (next_n = 1): the native layout."""
    b, inputs = _case2(backend, 0)
    batch = Batch.for_decode_capture(inputs, 4)
    _check_case2_compressed(b["compressed"].build_decode(batch))
    for name, lens in (("indexer.c1a", [6, 10, 0, 0]), ("indexer.c2a", [3, 5, 0, 0])):
        decode = b[name].build_decode(batch).decode
        assert decode.seq_lens.tolist() == [[x] for x in lens]
        assert decode.decode_lens.tolist() == [1, 1, 0, 0]


def test_case2_mixed_graph_varlen(backend):
    """The same step in a 4-token bucket of a next_n = 2 arena: one row per token (the
    varlen layout), ``decode_lens`` all 1."""
    b, inputs = _case2(backend, 1)
    batch = Batch.for_mixed_capture(inputs, 4, 4)
    _check_case2_compressed(b["compressed"].build_mixed(batch))
    for name, lens in (("indexer.c1a", [6, 10, 0, 0]), ("indexer.c2a", [3, 5, 0, 0])):
        decode = b[name].build_mixed(batch).decode
        assert decode.seq_lens.tolist() == [[x] for x in lens]
        assert decode.decode_lens.tolist() == [1, 1, 1, 1]


CASE3_TABLES = {
    "c1a.compressed_kv": [[3, 4], [5, 6], [7]], "c1a.index_k": [[1, 2], [3, 4], [5]],
    "c2a.compressed_kv": [[11, 15], [12, 13], [14]], "c2a.index_k": [[1, 2], [3, 4], [5]],
    "c2a.compressor_state": [[1], [2], [3]],
}


@pytest.mark.parametrize("flatten", [False, True])
def test_case3_mixed_batch(backend, flatten):
    """Verify decode ``L = 10, q = 2``; chunk ``L = 11, q = 4``; fresh prefill ``L = q = 5``
    (threshold 2): split (1, 2, 2, 9)."""
    cfg, b, inputs = _world(backend, 1, use_flattening=flatten)
    _, batch = _stage(cfg, inputs, [2, 4, 5], [10, 11, 5], CASE3_TABLES)
    kv = b["compressed"].build(batch).types
    assert kv["c2a"].slot_mapping.tolist() == [-1, 60, 51, -1, 52, -1, -1, 56, -1, 57, -1]
    assert kv["c1a"].slot_mapping.tolist() == [32, 33, 47, 48, 49, 50] + list(range(56, 61))
    c1a, c2a = b["indexer.c1a"].build(batch), b["indexer.c2a"].build(batch)
    for meta, native, ke, ks in ((c1a, [[9, 10]], [8, 9, 10, 11] + list(range(12, 17)), 11),
                                 (c2a, [[4, 5]], [4, 4, 5, 5, 5, 6, 6, 7, 7], 5)):
        assert (meta.num_decodes, meta.num_prefills, meta.num_decode_tokens,
                meta.num_prefill_tokens) == (1, 2, 2, 9)
        want = [[x] for x in native[0]] if flatten else native
        assert meta.decode.seq_lens.tolist() == want
        (chunk,) = meta.prefill.chunks
        assert chunk.cu_seqlen_ke.tolist() == ke
        assert chunk.cu_seqlen_ks.tolist() == [0] * 4 + [ks] * 5


CASE4_TABLES = {"c1a.compressed_kv": [[3, 4]], "c1a.index_k": [[1, 2]],
                "c2a.compressed_kv": [[11, 15]], "c2a.index_k": [[1, 2]],
                "c2a.compressor_state": [[1]]}


@pytest.mark.parametrize("mixed", [False, True])
def test_case4_bounded_replay(backend, mixed):
    """One request, ``L = 12``, ``q = 8`` (positions 4..11), after an 8-token prefix hit:
    ``replay_start = 4``. The replayed positions 4..7 write no compressed entry (p = 5 and 7
    would have written c2a's 46 and 47), in the compressed and the index-K groups; the
    entries they may read, and the ring slots, are as without replay."""
    cfg, b, inputs = _world(backend)
    _, batch = _stage(cfg, inputs, [8], [12], CASE4_TABLES, replay_start=[4])
    if mixed:
        inputs.copy_to_device(4, 16)
        batch = Batch.for_mixed_capture(inputs, 4, 16)
    kv = (b["compressed"].build_mixed(batch) if mixed else b["compressed"].build(batch)).types
    pad = [-1] * 8 if mixed else []
    assert kv["c1a"].slot_mapping.tolist() == [-1] * 4 + [32, 33, 34, 35] + pad
    assert kv["c2a"].slot_mapping.tolist() == [-1] * 5 + [60, -1, 61] + pad
    zeros = [0] * len(pad)
    assert kv["c1a"].entry_counts.tolist() == list(range(5, 13)) + zeros
    assert kv["c2a"].entry_counts.tolist() == [2, 3, 3, 4, 4, 5, 5, 6] + zeros
    assert kv["c2a"].ring_slot_mapping.tolist() == [12, 13, 14, 15, 8, 9, 10, 11] + pad
    # The index-K groups alike (rows [1, 2]; c2a S = 4).
    index = {n: (b[f"indexer.{n}"].build_mixed(batch) if mixed else b[f"indexer.{n}"].build(
        batch)).slot_mapping.tolist() for n in ("c1a", "c2a")}
    assert index == {"c1a": [-1] * 4 + [16, 17, 18, 19] + pad,
                     "c2a": [-1] * 5 + [8, -1, 9] + pad}
    # Without the replay the same step writes every entry its positions complete.
    _, batch = _stage(cfg, inputs, [8], [12], CASE4_TABLES, replay_start=[0])
    kv = b["compressed"].build(batch).types
    assert kv["c2a"].slot_mapping.tolist() == [-1, 46, -1, 47, -1, 60, -1, 61]
