"""The SWA builder's contract: buffers, thresholds, fixed views, typed errors before any
write, and graph safety of the decode build (no host read, no data-dependent branch, one
kernel)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.op_trace import HOST_READS, OpTrace
from helpers.support import DEVICE, make_step, stage

from staticattn.arena import ArenaConfig
from staticattn.builders import Batch, make_arena
from staticattn.builders.swa.builder import SparseSWAMetadataBuilder
from staticattn.builders.swa.declarations import dense_prefill_chunk_rows
from staticattn.errors import ArenaError, CapacityError, ConfigError, InvalidBatchError
from staticattn.kernels.swa import prefill_gather as swa_prefill
from staticattn.kernels.swa import swa_rows as swa_decode
from staticattn.reference.swa import assert_matches, expected_for_step

V4_SMALL = dict(
    device=DEVICE, block_size=256, architecture="deepseek_v4", compress_ratios=(1, 4, 128),
    sliding_window=16, swa_block_size=16, max_model_len=4096, max_num_seqs=8,
    max_num_batched_tokens=256, num_speculative_tokens=1,
)


def _setup(backend="torch", **overrides):
    cfg = ArenaConfig(**{**V4_SMALL, "kernel_backend": backend, **overrides})
    builder = SparseSWAMetadataBuilder()
    arena, inputs = make_arena(cfg, [builder])
    return cfg, builder, arena, inputs


# ----------------------------------------------------------------------------- buffers
@pytest.mark.parametrize("ratios", [(1,), (1, 4), (1, 4, 128)])
def test_buffer_table(ratios):
    cfg = ArenaConfig(**{**V4_SMALL, "compress_ratios": ratios})
    decls = {d.name: (d.shape, d.dtype) for d in SparseSWAMetadataBuilder().buffers(cfg)}
    td = cfg.max_num_seqs * cfg.next_n
    assert cfg.max_decode_tokens == td  # decode rows: max_num_seqs * next_n, not all tokens
    expected = {
        "swa.is_valid_token": ((cfg.max_num_batched_tokens,), torch.bool),
        "swa.decode_swa_indices": ((td, 1, 16), torch.int32),
        "swa.decode_swa_lens": ((td,), torch.int32),
        "swa.prefill_gather_lens": ((cfg.max_num_seqs,), torch.int32),
        "swa.prefill_seq_lens": ((cfg.max_num_seqs,), torch.int32),
    }
    # The paged prefill rows, one chunk plan per windowed type, one layer's per-layer rows
    # (the widest: C4A's combined rows, round_up(index_topk + W, 128)).
    t, plans = cfg.max_num_batched_tokens, len(ratios)
    scratch = t * (2176 if 4 in ratios else 128)
    expected |= {
        "swa.prefill_swa_indices": ((t, 1, 16), torch.int32),
        "swa.prefill_swa_lens": ((t,), torch.int32),
        "swa.prefill_chunks": ((plans, cfg.max_num_seqs, 4), torch.int32),
        "swa.prefill_num_chunks": ((plans,), torch.int32),
        "swa.row_scratch": ((scratch,), torch.int32),
        "swa.row_scratch_lens": ((t,), torch.int32),
    }
    if 128 in ratios:
        rows, max_c = dense_prefill_chunk_rows(cfg), cfg.dense_width
        expected["swa.dense_decode_indices"] = ((td, 1, max_c), torch.int32)
        expected["swa.dense_decode_lens"] = ((td,), torch.int32)
        expected["swa.dense_prefill_indices"] = ((rows, max_c), torch.int32)
        expected["swa.dense_prefill_lens"] = ((rows,), torch.int32)
    assert decls == expected


def test_needs_sliding_window():
    cfg = ArenaConfig(device=DEVICE, max_model_len=1024)
    with pytest.raises(ConfigError, match="sliding_window"):
        SparseSWAMetadataBuilder().buffers(cfg)


def test_accepts_decode_context_parallel_replicated():
    """Under DCP the SWA metadata is replicated: the same buffers as one GPU, and a SWA table
    that spans every token (not a rank's share)."""
    one = ArenaConfig(**V4_SMALL)
    cfg = ArenaConfig(**{**V4_SMALL, "dcp_world_size": 2, "dcp_rank": 1,
                         "cp_kv_cache_interleave_size": 4})
    builder = SparseSWAMetadataBuilder()
    assert builder.buffers(cfg) == builder.buffers(one)
    assert cfg.max_swa_blocks_per_req == one.max_swa_blocks_per_req


def test_unbound_builder_says_so():
    with pytest.raises(ArenaError, match="bind"):
        _ = SparseSWAMetadataBuilder().decode_threshold


# -------------------------------------------------------------------------- thresholds
@pytest.mark.parametrize("num_spec", [0, 1, 2, 3])
def test_one_decode_threshold(num_spec):
    """The reference's SWA builder keeps reorder_batch_threshold = 1 under MTP (spec §3.1,
    §11 item 3); here both equal config.decode_threshold = next_n."""
    cfg, builder, _, inputs = _setup(num_speculative_tokens=num_spec)
    n = cfg.next_n
    assert builder.decode_threshold == builder.reorder_batch_threshold == cfg.decode_threshold
    assert builder.decode_threshold == n
    # An MTP decode of n tokens after a shorter one is a decode; n + 1 tokens is a prefill.
    step = make_step(cfg, [1, n, n + 1], [50, 60, 70])
    meta = builder.build(stage(inputs, step))
    assert (meta.num_decodes, meta.num_prefills, meta.num_decode_tokens) == (2, 1, 1 + n)


# ------------------------------------------------------------------------- fixed views
def _tensor_fields(meta) -> dict[str, tuple]:
    return {
        name: (v.data_ptr(), tuple(v.shape), tuple(v.stride()))
        for name in meta.__slots__
        if isinstance(v := getattr(meta, name), torch.Tensor)
    }


def test_build_decode_returns_the_same_views(backend):
    cfg, builder, arena, inputs = _setup(backend)
    seen = []
    for seed in range(3):
        rng = np.random.default_rng(seed)
        step = make_step(cfg, [2] * 3, rng.integers(2, 4000, 3), num_reqs_padded=5,
                         num_tokens_padded=10, rng=rng)
        stage(inputs, step)
        meta = builder.build_decode(Batch.for_decode_capture(inputs, 5))
        assert_matches(meta, expected_for_step(cfg, step))
        seen.append((_tensor_fields(meta), meta.tile_sched("c128a")))
    assert seen[0][0] == seen[1][0] == seen[2][0]
    assert seen[0][0]["decode_swa_indices"][0] == arena["swa.decode_swa_indices"].data_ptr()
    assert seen[0][0]["dense_decode_indices"][2] == (cfg.dense_width,) * 2 + (1,)
    assert seen[0][1] is not seen[1][1]  # a fresh tile-scheduler metadata per build


def test_invalid_rows_are_rewritten_not_stale(backend):
    cfg, builder, arena, inputs = _setup(backend)
    stage(inputs, make_step(cfg, [2] * 4, [4000, 3000, 900, 300]))
    builder.build_decode(Batch.for_decode_capture(inputs, 4))
    assert (arena["swa.dense_decode_lens"][:8] > 0).all()
    step = make_step(cfg, [2] * 4, [4000, 3000, 900, 300], invalid_tokens=range(8))
    stage(inputs, step)
    meta = builder.build_decode(Batch.for_decode_capture(inputs, 4))
    assert (meta.decode_swa_indices == -1).all() and (meta.decode_swa_lens == 0).all()
    assert (meta.dense_decode_indices == -1).all() and (meta.dense_decode_lens == 0).all()


# ------------------------------------------------------------------------------ errors
def _snapshot(arena) -> dict[str, torch.Tensor]:
    return {name: arena[name].clone() for name in arena.names() if name.startswith("swa.")}


def _assert_unchanged(arena, before) -> None:
    for name, value in before.items():
        assert torch.equal(arena[name], value), name


def test_too_many_decode_tokens_is_a_capacity_error():
    cfg, builder, arena, inputs = _setup(max_num_seqs=2, num_speculative_tokens=0)
    # Two decodes padded to 4 tokens: all decodes, Td = 4 > max_decode_tokens = 2.
    batch = stage(inputs, make_step(cfg, [1, 1], [10, 20], num_tokens_padded=4))
    before = _snapshot(arena)
    with pytest.raises(CapacityError, match="max_decode_tokens=2"):
        builder.build(batch)
    _assert_unchanged(arena, before)


def test_build_decode_needs_the_uniform_capture_shape():
    cfg, builder, arena, inputs = _setup()
    batch = stage(inputs, make_step(cfg, [2, 1], [10, 20]))
    before = _snapshot(arena)
    with pytest.raises(InvalidBatchError, match="uniform decode batch"):
        builder.build_decode(batch)
    _assert_unchanged(arena, before)


@pytest.mark.parametrize("missing", ["positions", "token_to_req", "swa_block_table"])
def test_batch_without_device_derived_views_is_rejected(missing):
    cfg, builder, arena, inputs = _setup()
    batch = stage(inputs, make_step(cfg, [2, 2], [10, 20]))
    setattr(batch, missing, None)
    before = _snapshot(arena)
    with pytest.raises(InvalidBatchError, match=missing):
        builder.build(batch)
    _assert_unchanged(arena, before)


# ------------------------------------------------------------------------ graph safety


def test_torch_decode_build_reads_nothing_back_and_never_branches_on_data():
    cfg, builder, _, inputs = _setup("torch")
    traces = []
    # A first, untraced build cuts and keeps the views of this size; then only data differ.
    stage(inputs, make_step(cfg, [2, 2], [9, 9], num_reqs_padded=3, num_tokens_padded=6))
    builder.build_decode(Batch.for_decode_capture(inputs, 3))
    for lens, invalid in (([3, 4], ()), ([4000, 2500], (0, 3))):
        stage(inputs, make_step(cfg, [2, 2], lens, num_reqs_padded=3, num_tokens_padded=6,
                                invalid_tokens=invalid))
        with OpTrace() as trace:
            builder.build_decode(Batch.for_decode_capture(inputs, 3))
        traces.append(trace.ops)
    assert "copy_" in traces[0] and not HOST_READS & set(traces[0])
    assert traces[0] == traces[1]  # same ops whatever the data: no data-dependent branch


def _count_launches(monkeypatch, module, attr, *, run: bool = True) -> list[int]:
    calls = []
    define = getattr(module, attr)

    class Counting:
        def __getitem__(self, grid):
            calls.append(grid)
            return define()[grid] if run else (lambda *args, **kwargs: None)

    monkeypatch.setattr(module, attr, lambda: Counting())
    return calls


def test_triton_launches_one_kernel_for_decode_two_with_prefills(monkeypatch):
    cfg, builder, _, inputs = _setup("triton")
    decode = _count_launches(monkeypatch, swa_decode, "_swa_decode_kernel")
    prefill = _count_launches(monkeypatch, swa_prefill, "_gather_lens_kernel")
    stage(inputs, make_step(cfg, [2, 2, 2], [300, 40, 3000], num_reqs_padded=4,
                            num_tokens_padded=8))
    builder.build_decode(Batch.for_decode_capture(inputs, 4))
    assert (len(decode), len(prefill)) == (1, 0)
    builder.build(stage(inputs, make_step(cfg, [2, 1, 40], [300, 40, 100])))
    assert (len(decode), len(prefill)) == (2, 1)


def test_triton_decode_build_runs_no_torch_op_besides_views(monkeypatch):
    """With the one kernel launch stubbed out, what is left of build_decode is views: no
    torch op that could launch a kernel, allocate or read the device."""
    cfg, builder, _, inputs = _setup("triton")
    stage(inputs, make_step(cfg, [2, 2], [300, 40], num_reqs_padded=3, num_tokens_padded=6))
    launches = _count_launches(monkeypatch, swa_decode, "_swa_decode_kernel", run=False)
    with OpTrace() as trace:
        builder.build_decode(Batch.for_decode_capture(inputs, 3))
    assert len(launches) == 1
    assert trace.ops and set(trace.ops) <= {"slice", "select", "alias", "view", "as_strided"}
