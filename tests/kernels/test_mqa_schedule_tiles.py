"""The paged-MQA-logits schedule once a step's decode rows span more than one of the Triton
kernel's 128-row tiles with two tokens per atom (``next_n >= 3``, ``deepgemm-flashmla.md``
§1.2): the units a tile carries into the next are counted in splits and scaled by the atoms
once, so a slip there moves every later row's SM starts -- past the schedule's
``num_sms + 1`` rows. Both backends against the oracle, with guard rows behind the buffer
that must keep their value."""

from __future__ import annotations

import pytest
import torch
from helpers.support import DEVICE

from staticattn.kernels.indexer.mqa_schedule import paged_mqa_schedule
from staticattn.reference import indexer as oracle

#: Rows behind the schedule in the same allocation: a store past row ``num_sms`` lands here.
GUARD = 64
UNTOUCHED = -5


def _lens(rows: int, next_n: int) -> list[list[int]]:
    """``rows`` requests of ``next_n`` tokens, the last column the longest (only it counts):
    lengths from 0 to ~9000, some rows empty, so tiles differ in their split counts."""
    out = []
    for b in range(rows):
        last = 0 if b % 11 == 5 else 1 + (b * 7919) % 9000
        out.append([max(0, last - next_n + 1 + j) for j in range(next_n)])
    return out


@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize(("rows", "next_n", "num_sms"), [
    (129, 3, 7),     # one row into the second tile, few SMs: most rows own none
    (300, 4, 132),   # three tiles, an H200's SM count
    (257, 3, 300),   # more SMs than units in some rows: many rows own several SMs
])
def test_rows_past_one_tile_with_two_tokens_an_atom(backend, rows, next_n, num_sms, legacy):
    lens = _lens(rows, next_n)
    block = torch.full((num_sms + 1 + GUARD, 2), UNTOUCHED, dtype=torch.int32, device=DEVICE)
    paged_mqa_schedule(backend, torch.tensor(lens, dtype=torch.int32, device=DEVICE),
                       block[: num_sms + 1], legacy_remainder=legacy)
    got = block.tolist()
    assert got[num_sms + 1:] == [[UNTOUCHED] * 2] * GUARD, "written past the schedule"
    assert got[: num_sms + 1] == oracle.mqa_schedule(lens, num_sms, legacy)
