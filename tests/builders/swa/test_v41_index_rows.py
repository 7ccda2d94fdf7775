"""The per-layer rows' API: caller-owned outputs, a narrower active width for a type that
reads every entry, and the typed errors (before anything is written)."""

from __future__ import annotations

import pytest
import torch
from helpers.support import DEVICE
from helpers.v41_swa_steps import EXAMPLE_V41, example_step, oracle_step, stage_eager

from staticattn.arena import ArenaConfig
from staticattn.builders import SparseSWAMetadataBuilder, make_arena
from staticattn.builders.swa.declarations import combined_width, flashinfer_width, prefill_swa_width
from staticattn.builders.swa.draft import draft_swa_width
from staticattn.errors import ArenaError, InvalidBatchError
from staticattn.model import layer_type
from staticattn.reference import v41_rows


def _meta(backend="torch", **overrides):
    cfg = ArenaConfig(**{**EXAMPLE_V41, "kernel_backend": backend, **overrides})
    builder = SparseSWAMetadataBuilder()
    arena, inputs = make_arena(cfg, [builder])
    step, rs = example_step(cfg, [1, 6], [9, 14], [[1, 2, 3, 4]] * 2, replay_start=[0, 5]
                            if cfg.bounded_replay else None)
    return cfg, builder, arena, builder.build(stage_eager(inputs, step, rs)), step, rs


def test_caller_owned_outputs(backend):
    cfg, builder, arena, meta, step, rs = _meta(backend)
    scratch = arena["swa.row_scratch"].clone()
    out = torch.full((6, 128), 7, dtype=torch.int32, device=DEVICE)
    lens = torch.zeros(6, dtype=torch.int32, device=DEVICE)
    topk = torch.arange(28, dtype=torch.int32, device=DEVICE).reshape(7, 4) % 5 - 1
    rows, got_lens = builder.prefill_combined_rows(meta, "c1a", topk, out=out, lens_out=lens)
    assert rows.data_ptr() == out.data_ptr() and got_lens.data_ptr() == lens.data_ptr()
    want = v41_rows.combined(cfg, oracle_step(step, rs, padded=True), layer_type("c1a"),
                             topk.tolist(), 4, 6)
    assert (rows.tolist(), got_lens.tolist()) == want
    assert torch.equal(arena["swa.row_scratch"], scratch)  # the scratch untouched


def test_a_type_reading_every_entry_takes_a_narrower_active_width(backend):
    cfg, builder, _, meta, step, rs = _meta(
        backend, architecture="deepseek_v4", compress_ratios=(1, 4, 128), block_size=256,
        max_model_len=128 * 300)
    assert cfg.dense_width == 384  # round_up(9600 + W, 128) would overflow the scratch
    with pytest.raises(ArenaError, match="pass out="):
        builder.prefill_combined_rows(meta, "c128a")
    rows, lens = builder.prefill_combined_rows(meta, "c128a", topk_width=124)
    want = v41_rows.combined(cfg, oracle_step(step, rs, padded=True), layer_type("c128a"),
                             None, 124, 6)
    assert (rows.tolist(), lens.tolist()) == want
    with pytest.raises(InvalidBatchError, match="not served"):
        builder.flashinfer_rows(meta, "c128a")


@pytest.mark.parametrize("call, error, match", [
    (lambda b, m: b.prefill_combined_rows(m, "c2a"), InvalidBatchError, "topk"),
    (lambda b, m: b.prefill_combined_rows(m, "c4a"), InvalidBatchError, "not a windowed"),
    (lambda b, m: b.prefill_combined_rows(m, "swaonly", topk_width=4), InvalidBatchError,
     "topk_width must be 0"),
    (lambda b, m: b.flashinfer_rows(m, "c1a", torch.zeros(7, 4, dtype=torch.int32)),
     InvalidBatchError, "compressed_block_table"),
    (lambda b, m: b.prefill_combined_rows(
        m, "swaonly", out=torch.zeros(6, 64, dtype=torch.int32)), ArenaError, "contiguous"),
])
def test_misuse_is_a_typed_error_before_any_write(call, error, match):
    _, builder, arena, meta, _, _ = _meta()
    before = arena["swa.row_scratch"].clone(), arena["swa.row_scratch_lens"].clone()
    with pytest.raises(error, match=match):
        call(builder, meta)
    assert torch.equal(arena["swa.row_scratch"], before[0])
    assert torch.equal(arena["swa.row_scratch_lens"], before[1])


def test_without_a_row_scratch_the_rows_need_another_builder():
    cfg = ArenaConfig(**EXAMPLE_V41)
    builder = SparseSWAMetadataBuilder(name="other", row_scratch=False)
    _, inputs = make_arena(cfg, [builder])
    step, rs = example_step(cfg, [6], [6], [[1, 2]])
    meta = builder.build(stage_eager(inputs, step, rs))
    with pytest.raises(ArenaError, match="no row scratch"):
        builder.prefill_combined_rows(meta, "swaonly")


@pytest.mark.parametrize("preset, k, width", [("deepseek-v4.1-flash", 512, 640),
                                              ("deepseek-v4.1-large", 1024, 1152)])
def test_widths_of_the_presets(preset, k, width):
    """deepseek-v41.md §7.2, §7.3, §7.5: 640 for V4.1-Flash, 1152 for top-1024."""
    cfg = ArenaConfig.preset(preset, device=DEVICE, max_num_seqs=4, max_num_batched_tokens=64,
                             max_model_len=4096)
    assert combined_width(cfg, layer_type("c1a")) == combined_width(cfg, layer_type("c2a")) \
        == width
    assert combined_width(cfg, layer_type("swaonly")) == prefill_swa_width(cfg) == 128
    assert flashinfer_width(cfg, layer_type("c2a")) == 128 + k
    assert draft_swa_width(cfg) == 192
