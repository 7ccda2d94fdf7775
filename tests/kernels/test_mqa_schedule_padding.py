"""The paged-MQA-logits schedule (``deepgemm-flashmla.md`` §1.2) of a decode step padded to a
graph's size: empty rows (length 0) after the last real one, when the work units divide
evenly among the SMs (no remainder) -- the case where the last real row's end falls exactly
on an SM's start and every empty row behind it owns no SM, so the end sentinel row stays
``(B * A, 0)``. Both backends and both remainder rules against the oracle."""

from __future__ import annotations

import pytest
import torch
from helpers.support import DEVICE

from staticattn.kernels.indexer.mqa_schedule import SPLIT_KV, paged_mqa_schedule
from staticattn.reference import indexer as oracle

#: ``(last column of the real rows, next_n, num_sms, padded rows)``: units = splits x atoms,
#: a multiple of num_sms.
CASES = [
    ([512, 512], 1, 4, 3),         # 4 units on 4 SMs: one each
    ([1000, 300, 2100], 1, 5, 2),  # 15 units on 5 SMs
    ([512, 256], 3, 6, 4),         # 3 splits x 2 atoms on 6 SMs
    ([5000, 1000], 4, 8, 1),       # 24 splits x 2 atoms on 8 SMs
]


@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize(("real", "next_n", "num_sms", "padded"), CASES)
def test_padded_rows_when_the_units_divide_evenly(backend, real, next_n, num_sms, padded,
                                                  legacy):
    atoms = -(-next_n // 2) if next_n > 1 else 1
    assert sum(-(-x // SPLIT_KV) for x in real) * atoms % num_sms == 0
    lens = [[max(0, x - next_n + 1 + j) for j in range(next_n)] for x in real]
    lens += [[0] * next_n] * padded
    out = torch.full((num_sms + 1, 2), -5, dtype=torch.int32, device=DEVICE)
    paged_mqa_schedule(backend, torch.tensor(lens, dtype=torch.int32, device=DEVICE), out,
                       legacy_remainder=legacy)
    want = oracle.mqa_schedule(lens, num_sms, legacy)
    assert want[-1] == [len(lens) * atoms, 0]
    assert out.tolist() == want
