"""The SWA kernels directly: wide dense rows (several column blocks), the compiled tile shape
run interpreted, the gather-lengths kernel over several programs, and the row-stride guard."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.support import DEVICE, make_step, stage

from staticattn.arena import ArenaConfig
from staticattn.builders import make_arena
from staticattn.builders.swa.builder import SparseSWAMetadataBuilder
from staticattn.errors import ArenaError
from staticattn.kernels.swa.prefill_gather import prefill_gather_lens
from staticattn.kernels.swa.swa_rows import SWADecodeOutputs, build_swa_decode
from staticattn.reference.swa import assert_matches, expected_for_step

WIDE = dict(
    device=DEVICE, block_size=256, architecture="deepseek_v4", compress_ratios=(1, 4, 128),
    sliding_window=128, swa_block_size=64, max_model_len=150_000, max_num_seqs=6,
    max_num_batched_tokens=64, num_speculative_tokens=1,
)


def test_wide_dense_rows_span_several_column_blocks(backend):
    cfg = ArenaConfig(**WIDE, kernel_backend=backend)
    assert cfg.dense_width == 1280  # > the kernel's 1024-column block
    builder = SparseSWAMetadataBuilder()
    _, inputs = make_arena(cfg, [builder])
    rng = np.random.default_rng(7)
    for lens in ([150_000, 131_073, 1024 * 128 + 5], [2, 127, 128], [149_999, 40_000, 9]):
        step = make_step(cfg, [2, 1, 2], lens, invalid_tokens=[2], rng=rng)
        assert_matches(builder.build(stage(inputs, step)), expected_for_step(cfg, step))


def _random_decode_inputs(rng, num_tokens, num_reqs, cols, max_pos):
    req = np.sort(rng.integers(0, num_reqs, num_tokens))
    host = dict(
        slot_mapping=np.where(rng.random(num_tokens) < 0.2, -1, 5),
        positions=rng.integers(0, max_pos, num_tokens),
        token_to_req=req.astype(np.int32),
        swa_block_table=rng.integers(1, 10_000, (num_reqs, cols), dtype=np.int32),
        block_table=rng.integers(1, 10_000, (num_reqs, cols), dtype=np.int32),
    )
    return {name: torch.from_numpy(a).to(DEVICE) for name, a in host.items()}


def _outputs(tokens: int, rows: int, window: int, width: int,
             rng: np.random.Generator) -> SWADecodeOutputs:
    """Outputs as a previous step left them: SWA rows poisoned whole (they are rewritten
    whole), dense rows holding stale entries up to a random earlier length and -1 after it
    (the invariant every writer keeps, which lets the kernel stop at the longer length)."""
    old = torch.from_numpy(rng.integers(0, width + 1, rows).astype(np.int32)).to(DEVICE)
    stale = torch.arange(width, device=DEVICE)[None, None, :] < old[:, None, None]
    return SWADecodeOutputs(
        is_valid_token=torch.zeros(tokens + 5, dtype=torch.bool, device=DEVICE),
        swa_indices=torch.full((rows, 1, window), 77, dtype=torch.int32, device=DEVICE),
        swa_lens=torch.full((rows,), 77, dtype=torch.int32, device=DEVICE),
        dense_indices=torch.where(stale, 77, -1).to(torch.int32),
        dense_lens=old.clone(),
    )


@pytest.mark.parametrize("block_tokens", [1, 2, 4])
def test_compiled_tile_shape_matches_torch(block_tokens):
    """The compiled default (2 tokens per program) and other tiles, interpreted here; odd
    token and decode-token counts leave partial tiles."""
    rng = np.random.default_rng(block_tokens)
    num_tokens, num_decode_tokens, window, swa_bs, entries = 37, 21, 7, 16, 2
    args = _random_decode_inputs(rng, num_tokens, num_reqs=5, cols=64, max_pos=1000)
    results = []
    for backend, tile in (("torch", None), ("triton", block_tokens)):
        out = _outputs(num_tokens, num_decode_tokens, window, 256, np.random.default_rng(0))
        build_swa_decode(backend, out, args["slot_mapping"], args["positions"],
                         args["token_to_req"], args["swa_block_table"], swa_bs,
                         args["block_table"], 128, entries, num_tokens, num_decode_tokens,
                         block_tokens=tile)
        results.append(out)
    ref, got = results
    for name in ("is_valid_token", "swa_indices", "swa_lens", "dense_indices", "dense_lens"):
        assert torch.equal(getattr(ref, name), getattr(got, name)), name
    assert not ref.is_valid_token[num_tokens:].any()  # nothing written past the step


def test_strided_rows_are_refused():
    out = _outputs(4, 4, 8, 128, np.random.default_rng(0))
    wide = torch.zeros(4, 1, 16, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ArenaError, match="row stride"):
        SWADecodeOutputs(out.is_valid_token, wide[..., :8], out.swa_lens)


@pytest.mark.parametrize("num_decodes,num_prefills", [(0, 1), (3, 5), (7, 300)])
def test_prefill_gather_lens(backend, num_decodes, num_prefills):
    rng = np.random.default_rng(num_prefills)
    window, num_reqs = 128, num_decodes + num_prefills
    query_lens = rng.integers(1, 700, num_reqs)
    seq_lens = query_lens + rng.integers(0, 2000, num_reqs) * (rng.random(num_reqs) < 0.7)
    qsl = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    out = torch.full((num_prefills + 3,), -7, dtype=torch.int32, device=DEVICE)
    prefill_gather_lens(backend, torch.from_numpy(seq_lens.astype(np.int32)).to(DEVICE),
                        torch.from_numpy(qsl).to(DEVICE), num_decodes, num_prefills, window, out)
    want = [int(query_lens[r]) + min(int(seq_lens[r] - query_lens[r]), window - 1)
            for r in range(num_decodes, num_reqs)]
    assert out[:num_prefills].tolist() == want
    assert out[num_prefills:].tolist() == [-7] * 3
