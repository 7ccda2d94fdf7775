"""The short-context top-k fill (``vllm-0.33-extras.md`` §4) when the top-k is wider than one
column block of the Triton kernels (1024): DeepSeek V3.2's top-k of 2048, and a width that
is not a multiple of the block. Key counts around the block edge and the width, on both
backends, against the oracle (``staticattn/reference/short_topk.py``): the fill kernel in
place, and the fused fill of the compressed decode operand (its lengths summed over the
column blocks); no row written past its width."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.support import DEVICE

from staticattn.kernels.compressed.topk_operand import global_topk_slots
from staticattn.kernels.indexer.short_topk_fill import fill_short_context_topk
from staticattn.reference import short_topk as oracle

I32 = dict(dtype=torch.int32, device=DEVICE)
#: Keys per page of the compressed cache's table, and the table's width (pages).
ENTRIES, PAGES = 64, 160


def _counts(width: int) -> list[int]:
    """Key counts of the rows: none, one, each side of the column block and of the width,
    far past it; fitting and scored rows alternate so a row's overrun lands on another."""
    edge = [0, 1, 1023, 1024, 1025, width - 1, width, width + 1, 9000]
    return [x for pair in zip(edge, [5000] * len(edge)) for x in pair]


def _scored(rng, counts, width) -> list[list[int]]:
    """Per row a scored-looking row: some of its keys in random order, -1 after."""
    rows = []
    for n in counts:
        chosen = rng.choice(n, size=min(n, width), replace=False).tolist() if n else []
        rows.append(chosen + [-1] * (width - len(chosen)))
    return rows


@pytest.mark.parametrize("width", [2048, 1500])
def test_the_fill_past_one_column_block(backend, width):
    counts = _counts(width)
    scored = _scored(np.random.default_rng(width), counts, width)
    extra = [[7] * width]  # a row past num_rows: never written
    topk = torch.tensor(scored + extra, **I32)
    fill_short_context_topk(backend, topk, torch.tensor(counts + [3], **I32),
                            num_rows=len(counts))
    got = topk.tolist()
    for t, n in enumerate(counts):
        want = oracle.fill_row(n - 1, 1, width) if n <= width else scored[t]
        assert got[t] == want, (t, n)
    assert got[len(counts)] == extra[0]


@pytest.mark.parametrize("width", [2048, 1500])
def test_the_fused_fill_past_one_column_block(backend, width):
    """``global_topk_slots`` with entry counts: a fitting row reads ``0..n-1``, a scored
    row its top-k, an invalid token nothing; slots through the table, lengths counted
    over every column block."""
    counts = _counts(width)
    rng = np.random.default_rng(width + 1)
    scored = _scored(rng, counts, width)
    rows = len(counts)
    own = [-1 if t == 3 else t for t in range(rows)]  # token 3 (1023 keys) is invalid
    token_to_req = [t % 3 for t in range(rows)]
    table = rng.integers(1, 1000, size=(3, PAGES)).tolist()
    out = torch.full((rows + 1, width), 9, **I32)
    lens = torch.full((rows + 1,), 9, **I32)
    global_topk_slots(backend, torch.tensor(scored, **I32), torch.tensor(token_to_req, **I32),
                      torch.tensor(own, dtype=torch.int64, device=DEVICE),
                      torch.tensor(table, **I32), out, lens, num_rows=rows,
                      entries_per_block=ENTRIES, entry_counts=torch.tensor(counts, **I32))
    got, got_lens = out.tolist(), lens.tolist()
    for t, n in enumerate(counts):
        keys = [-1] * width if own[t] < 0 else (
            oracle.fill_row(n - 1, 1, width) if n <= width else scored[t])
        row = table[token_to_req[t]]
        want = [row[k // ENTRIES] * ENTRIES + k % ENTRIES if k >= 0 else -1 for k in keys]
        assert (got[t], got_lens[t]) == (want, sum(k >= 0 for k in keys)), (t, n)
    assert got[rows] == [9] * width and got_lens[rows] == 9
