"""The indexer builder's contract: declared buffers, fixed views, graph-safe decode build
(no host read, no device read, no stale value), typed errors."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from helpers.support import DEVICE, index_ratio_fields, make_step, stage

from staticattn.arena import ArenaConfig
from staticattn.builders import Batch, MetadataBuilder, make_arena
from staticattn.builders.indexer.builder import IndexerMetadataBuilder
from staticattn.errors import ArenaError, CapacityError, InvalidBatchError
from staticattn.reference import indexer as oracle


def _setup(backend="torch", **overrides):
    fields = dict(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=4096, num_sms=6,
                  device=DEVICE, kernel_backend=backend)
    fields.update(overrides)
    cfg = ArenaConfig(**fields)
    builder = IndexerMetadataBuilder()
    arena, inputs = make_arena(cfg, [builder])
    return cfg, builder, arena, inputs


@pytest.mark.parametrize(("n", "ratio", "flatten", "expected"), [
    (1, 1, None, {"decode_lens": (8,), "decode_seq_lens": (8,)}),
    (2, 4, None, {"decode_lens": (16,), "compressed_slot_mapping": (64,),
                  "expanded_block_table": (16, 16)}),
    (4, 1, None, {"decode_lens": (32,), "expanded_block_table": (32, 64)}),
    (4, 4, None, {"expanded_block_table": (32, 16), "compressed_slot_mapping": (64,)}),
    (1, 1, True, {"decode_lens": (8,)}),
])
def test_declared_buffers(n, ratio, flatten, expected):
    cfg = ArenaConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=4096,
                      block_size=64 if ratio == 1 else 256, num_speculative_tokens=n - 1,
                      **index_ratio_fields(ratio), use_flattening=flatten, num_sms=6,
                      device="cpu")
    decls = {d.name.removeprefix("indexer."): d for d in IndexerMetadataBuilder().buffers(cfg)}
    assert all(name.startswith("indexer.") for name in (d.name for d in decls.values()))
    assert decls["schedule_metadata"].shape == (7, 2)
    assert decls["cu_seqlen_ks"].shape == decls["cu_seqlen_ke"].shape == (64,)
    assert decls["cu_seq_lens"].shape == (16,)
    # Any MTP config needs the expanded table: the mixed build flattens MTP decodes.
    assert ("expanded_block_table" in decls) == (n > 1)
    # The device chunk plan: rows for every request plus the query sub-chunks of a token
    # bucket (E // max keys per request = 2^27 // 4096 queries each).
    assert decls["prefill_chunks"].shape == (8 + 1 + 1, 8)
    assert decls["req_key_start"].shape == (8,)
    assert ("compressed_slot_mapping" in decls) == (ratio > 1)
    for name, shape in expected.items():
        assert decls[name].shape == shape
    if ratio > 1:
        slots = decls["compressed_slot_mapping"]
        assert slots.dtype == torch.int64 and slots.fill == -1
    assert isinstance(IndexerMetadataBuilder(), MetadataBuilder)


def _fingerprint(meta):
    d = meta.decode
    return [(t.data_ptr(), tuple(t.shape), t.stride())
            for t in (meta.slot_mapping, d.seq_lens, d.decode_lens, d.block_table,
                      d.schedule_metadata)]


@pytest.mark.parametrize("n", [1, 2, 4])
def test_decode_build_returns_the_same_views_and_never_moves_the_arena(backend, n):
    cfg, builder, arena, inputs = _setup(backend, num_speculative_tokens=n - 1,
                                         block_size=256, **index_ratio_fields(4))
    before = arena.fingerprint()
    seen = set()
    rng = np.random.default_rng(n)
    for k in (4, 1, 3):
        stage(inputs, make_step(cfg, [n] * k, rng.integers(n, 4096, k), num_reqs_padded=4,
                                num_tokens_padded=4 * n, rng=rng))
        meta = builder.build_decode(Batch.for_decode_capture(inputs, 4))
        seen.add(tuple(_fingerprint(meta)))
    assert len(seen) == 1
    assert arena.fingerprint() == before


@pytest.mark.parametrize("n", [1, 2, 4])
def test_decode_build_reads_no_host_staging(backend, n):
    """After the staging kernel ran, scribbling over the host staging changes nothing."""
    cfg, builder, arena, inputs = _setup(backend, num_speculative_tokens=n - 1)
    step = make_step(cfg, [n] * 3, [900, n, 70], num_reqs_padded=4, num_tokens_padded=4 * n)
    stage(inputs, step)
    # A writer of the host staging waits for the in-flight copy first, as every writer does.
    inputs.wait_staging_free()
    inputs.host_query_start_loc.fill_(12345)
    inputs.host_seq_lens.fill_(-3)
    inputs.host_slot_mapping.fill_(777)
    meta = builder.build_decode(Batch.for_decode_capture(inputs, 4))
    oracle.assert_matches(meta, oracle.indexer_metadata(cfg, step, graph=True), step, arena)


@contextlib.contextmanager
def _no_device_reads(arena):
    """Make every host read of a tensor living in the arena's device block raise (on CPU
    the 'device' is host memory, so this is how a device->host sync shows up here)."""
    device = arena.block("device").untyped_storage().data_ptr()
    names = ("item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__")
    originals = {name: getattr(torch.Tensor, name) for name in names}

    def guard(name):
        def method(self, *args, **kwargs):
            if self.untyped_storage().data_ptr() == device:
                raise AssertionError(f"Tensor.{name} on an arena device view")
            return originals[name](self, *args, **kwargs)
        return method

    for name in names:
        setattr(torch.Tensor, name, guard(name))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_builds_never_read_the_device(n):
    cfg, builder, arena, inputs = _setup("torch", num_speculative_tokens=n - 1,
                                         block_size=256, **index_ratio_fields(4),
                                         max_prefill_workspace=40, max_logits_bytes=400)
    mixed = stage(inputs, make_step(cfg, [n, 1, 30, 9], [80, 40, 300, 9]))
    with _no_device_reads(arena):
        meta = builder.build(mixed)
    assert meta.num_prefills >= 2 and len(meta.prefill.chunks) > 2
    stage(inputs, make_step(cfg, [n] * 2, [80, 700], num_reqs_padded=3,
                            num_tokens_padded=3 * n))
    with _no_device_reads(arena):
        builder.build_decode(Batch.for_decode_capture(inputs, 3))
    with pytest.raises(AssertionError, match="arena device view"), _no_device_reads(arena):
        bool(builder.decode_lens[0])  # the guard's negative control


@pytest.mark.parametrize("n", [1, 2, 4])
def test_padding_after_a_long_step_is_not_stale(backend, n):
    cfg, builder, arena, inputs = _setup(backend, num_speculative_tokens=n - 1,
                                         block_size=256, **index_ratio_fields(4))
    stage(inputs, make_step(cfg, [n] * 8, [4000] * 8, num_reqs_padded=8,
                            num_tokens_padded=8 * n))
    builder.build_decode(Batch.for_decode_capture(inputs, 8))
    step = make_step(cfg, [n], [n + 5], num_reqs_padded=8, num_tokens_padded=8 * n)
    stage(inputs, step)
    meta = builder.build_decode(Batch.for_decode_capture(inputs, 8))
    d = meta.decode
    assert d.seq_lens.flatten()[n:].eq(0).all()
    assert meta.slot_mapping[n:].eq(-1).all()
    if n > 2:  # flattened: the expanded table is ours
        assert d.block_table[n:].eq(0).all()
    oracle.assert_matches(meta, oracle.indexer_metadata(cfg, step, graph=True), step, arena)


def test_errors_are_typed_and_raised_before_writing():
    with pytest.raises(ArenaError):
        IndexerMetadataBuilder().build_decode(None)
    cfg, builder, arena, inputs = _setup(num_speculative_tokens=1)
    stage(inputs, make_step(cfg, [2, 2], [10, 12]))
    with pytest.raises(InvalidBatchError, match="uniform decode batch"):
        builder.build_decode(Batch.from_inputs(inputs, 2, 3, 2, 12))
    batch = Batch.for_decode_capture(inputs, 2)
    batch.positions = None
    with pytest.raises(InvalidBatchError, match="positions"):
        builder.build(batch)
    # 12 padded requests of up to 2 tokens need 24 native cells; the capacity is 16.
    cfg, builder, arena, inputs = _setup(num_speculative_tokens=1, max_num_seqs=12,
                                         max_num_batched_tokens=16)
    stage(inputs, make_step(cfg, [2], [10], num_reqs_padded=12, num_tokens_padded=2))
    before = builder.decode_seq_lens.clone()
    with pytest.raises(CapacityError, match="max_decode_tokens=16"):
        builder.build(Batch.from_inputs(inputs, 12, 2, 2, 10))
    assert torch.equal(builder.decode_seq_lens, before)


@pytest.mark.parametrize("n", [1, 2])
def test_empty_batch_builds_nothing(backend, n):
    """A batch of no request and no token: no decode, no prefill, an empty slot mapping."""
    cfg, builder, arena, inputs = _setup(backend, num_speculative_tokens=n - 1,
                                         block_size=256, **index_ratio_fields(4))
    inputs.host.query_start_loc[0] = 0
    meta = builder.build(Batch.from_inputs(inputs, 0, 0, 0, 0))
    assert meta.decode is None and meta.prefill is None
    assert (meta.num_decodes, meta.num_prefills, meta.num_decode_tokens) == (0, 0, 0)
    assert meta.slot_mapping.shape == (0,)
