"""KV-sharing fast-prefill batch (seed ``make_kv_sharing_fast_prefill_common_attn_metadata``)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from helpers import planning as oracle
from helpers.planning import make_batch
from hypothesis import given, settings
from hypothesis import strategies as st

from staticattn.builders import make_kv_sharing_fast_prefill_batch
from staticattn.errors import InvalidBatchError


def test_seed_example():
    batch = make_batch([15, 5, 8], [41, 31, 40])
    padded = torch.tensor([14, 18, 19, 27, 0, 0], dtype=torch.int64)
    fast = make_kv_sharing_fast_prefill_batch(batch, padded, 4)
    assert fast.query_start_loc_cpu.tolist() == [0, 1, 3, 4]
    assert fast.query_start_loc.tolist() == [0, 1, 3, 4]
    assert fast.query_start_loc_cpu.dtype == torch.int32
    assert (fast.num_reqs, fast.num_actual_tokens, fast.max_query_len) == (3, 4, 2)
    assert fast.seq_lens is batch.seq_lens and fast.block_table is batch.block_table
    assert fast.max_seq_len == 41
    assert fast.positions is None and fast.token_to_req is None


def test_all_single_token_queries_keep_the_batch():
    batch = make_batch([1, 1], [5, 9])
    assert make_kv_sharing_fast_prefill_batch(batch, np.array([0, 1]), 2) is batch


def test_requests_without_selected_tokens():
    batch = make_batch([3, 4, 2], [3, 4, 2])
    fast = make_kv_sharing_fast_prefill_batch(batch, np.array([6, 8]), 2)
    assert fast.query_start_loc_cpu.tolist() == [0, 0, 1, 2]


@pytest.mark.parametrize(("indices", "count", "match"), [
    (torch.zeros(2, dtype=torch.int64, device="meta"), 2, "on meta"),
    (np.array([0, 1]), 3, "num_logits_indices=3"),
    (np.array([[0, 1]]), 1, "1-D"),
    (np.array([2, 9]), 2, "logits index 9 .* 9 real tokens"),
    (np.array([-1]), 1, "logits index -1"),
])
def test_bad_indices(indices, count, match):
    batch = make_batch([4, 5], [4, 5])
    with pytest.raises(InvalidBatchError, match=match):
        make_kv_sharing_fast_prefill_batch(batch, indices, count)


@st.composite
def fast_prefill_cases(draw):
    query_lens = draw(st.lists(st.integers(0, 30), min_size=1, max_size=10))
    total = sum(query_lens)
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    k = draw(st.integers(0, total))
    indices = sorted(rng.sample(range(total), k))
    pad = draw(st.integers(0, 4))
    return query_lens, indices, pad


@settings(max_examples=2000)
@given(case=fast_prefill_cases())
def test_matches_oracle(case):
    query_lens, indices, pad = case
    batch = make_batch(query_lens, [q + 3 for q in query_lens], max_query_len=max(
        2, max(query_lens)))
    padded = np.array(indices + [0] * pad, dtype=np.int64)
    fast = make_kv_sharing_fast_prefill_batch(batch, padded, len(indices))
    expected = oracle.fast_prefill_query_start_loc(batch.query_start_loc_cpu.tolist(), indices)
    assert fast.query_start_loc_cpu.tolist() == expected
    assert fast.num_actual_tokens == len(indices)
    assert fast.max_query_len == max(b - a for a, b in zip(expected, expected[1:], strict=False))
