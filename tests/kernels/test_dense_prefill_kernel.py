"""The C128A prefill chunk kernel directly: the compiled tile shapes (run interpreted) over a
workspace left stale by an earlier chunk, on rows wider than one column block, with the
step's counts static and read on the device, against the torch version and the spec's rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.support import DEVICE

from staticattn.kernels.staging.stage_inputs import COUNT_DECODE_TOKENS, COUNT_TOKENS
from staticattn.kernels.swa.dense_prefill_rows import build_dense_prefill_chunk

WIDTH, ROWS, RATIO = 1280, 7, 128  # 1280 > the kernel's 1024-column block


def _stale_workspace(rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows holding stale entries up to a random earlier length and -1 after it (the
    invariant every writer keeps)."""
    old = torch.from_numpy(rng.integers(0, WIDTH + 1, ROWS).astype(np.int32)).to(DEVICE)
    stale = torch.arange(WIDTH, device=DEVICE)[None, :] < old[:, None]
    return torch.where(stale, 77, -1).to(torch.int32), old.clone()


def _spec_rows(positions: list[int], td: int, nt: int, first: int, rows: int):
    """``vllm-0.33-extras.md`` §5.2 in loops: row ``o < n_c`` holds ``o``; dead rows -1."""
    out, lens = [], []
    for i in range(rows):
        t = td + first + i
        n = min((positions[t] + 1) // RATIO, WIDTH) if t < nt else 0
        out.append(list(range(n)) + [-1] * (WIDTH - n))
        lens.append(n)
    return out, lens


@pytest.mark.parametrize("device_counts", [False, True])
@pytest.mark.parametrize("block_tokens", [1, 2, 4])
@pytest.mark.parametrize("first", [0, 7, 14])
def test_compiled_tile_shapes_match_torch_and_the_spec(block_tokens, device_counts, first):
    rng = np.random.default_rng(block_tokens + first)
    num_tokens, td, nt = 24, 3, 19  # chunk 2 (first 14): 2 live rows, 5 dead
    pos = rng.integers(0, 170_000, num_tokens)
    positions = torch.from_numpy(pos).to(DEVICE)
    counts = torch.zeros(4, dtype=torch.int32, device=DEVICE)
    counts[COUNT_TOKENS], counts[COUNT_DECODE_TOKENS] = nt, td
    rows = min(ROWS, num_tokens - td - first)
    want = _spec_rows(pos.tolist(), td, nt, first, rows)
    for backend, tile in (("torch", None), ("triton", block_tokens)):
        indices, lens = _stale_workspace(np.random.default_rng(first))
        before = indices[rows:].clone()
        build_dense_prefill_chunk(
            backend, indices, lens, positions, RATIO, first, rows,
            99 if device_counts else nt, 99 if device_counts else td,
            counts if device_counts else None, block_tokens=tile)
        assert (indices[:rows].tolist(), lens[:rows].tolist()) == want, backend
        assert torch.equal(indices[rows:], before), "rows past the chunk are left alone"
