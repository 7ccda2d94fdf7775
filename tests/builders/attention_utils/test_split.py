"""split_decodes_and_prefills (spec §3.2) and the three-way decode / extend / prefill split."""

from __future__ import annotations

import pytest
from helpers import planning as oracle
from helpers.planning import batch_of, make_batch, plan_cases
from hypothesis import given, settings
from hypothesis import strategies as st

from staticattn.builders import split_decodes_and_prefills, split_decodes_prefills_and_extends
from staticattn.errors import InvalidBatchError


@pytest.mark.parametrize(
    ("query_lens", "threshold", "uniform", "num_tokens", "expected"),
    [
        ([2, 1, 3, 4, 5, 6, 7, 8], 4, False, None, (4, 4, 10, 26)),
        ([2, 1, 2, 4, 5, 6, 7, 8], 4, True, None, (1, 7, 2, 33)),
        ([2, 2, 2, 0], 3, True, 8, (4, 0, 8, 0)),
    ],
    ids=["non-uniform", "uniform", "padded-uniform"],
)
def test_spec_examples(query_lens, threshold, uniform, num_tokens, expected):
    batch = make_batch(query_lens, [q + 10 for q in query_lens], num_actual_tokens=num_tokens)
    assert split_decodes_and_prefills(batch, threshold, require_uniform=uniform) == expected


def test_all_decodes_counts_padded_tokens():
    # Step 1: Td is num_actual_tokens (graph padding included), not the sum of the queries.
    batch = make_batch([1, 1, 0], [5, 9, 0], num_actual_tokens=4)
    assert split_decodes_and_prefills(batch, 1) == (3, 0, 4, 0)


def test_first_request_long_means_no_decodes():
    batch = make_batch([5, 1, 1], [5, 9, 9], num_actual_tokens=9)
    assert split_decodes_and_prefills(batch, 1) == (0, 3, 0, 9)


def test_short_extend_is_a_prefill_when_asked():
    batch = make_batch([1, 1, 1, 6], [8, 4, 9, 6], is_prefilling=[False, True, False, True])
    assert split_decodes_and_prefills(batch, 1) == (3, 1, 3, 6)
    assert split_decodes_and_prefills(batch, 1, treat_short_extends_as_decodes=False) == (
        1, 3, 1, 8)


def test_padded_uniform_returns_before_is_prefilling():
    # Spec §3.2 orders step 3's padded-uniform return before step 4.
    batch = make_batch([2, 2, 0], [9, 4, 0], num_actual_tokens=6,
                       is_prefilling=[False, True, False])
    assert split_decodes_and_prefills(
        batch, 3, require_uniform=True, treat_short_extends_as_decodes=False) == (3, 0, 6, 0)


@pytest.mark.parametrize("query_lens", [[1, 4], [4, 1]])
def test_short_extends_need_is_prefilling(query_lens):
    # Raised whatever the lengths, also where the reference returns before its assertion.
    batch = make_batch(query_lens, [8, 4])
    with pytest.raises(InvalidBatchError, match="is_prefilling"):
        split_decodes_and_prefills(batch, 1, treat_short_extends_as_decodes=False)


def test_empty_batch():
    batch = make_batch([], [], num_actual_tokens=0)
    assert split_decodes_and_prefills(batch, 2, require_uniform=True) == (0, 0, 0, 0)
    assert split_decodes_prefills_and_extends(batch, 1) == (0, 0, 0, 0, 0, 0)


@pytest.mark.parametrize(
    ("query_lens", "seq_lens", "threshold", "max_query_len", "expected"),
    [
        ([1, 1, 4, 3], [9, 5, 10, 3], 1, None, (2, 1, 1, 2, 4, 3)),
        ([1, 1], [9, 5], 1, None, (2, 0, 0, 2, 0, 0)),
        ([2, 5, 7], [9, 8, 20], 2, None, (1, 2, 0, 2, 12, 0)),
        ([9, 4], [9, 4], 2, None, (0, 0, 2, 0, 0, 13)),
        # The seed's argmax over an all-false mask would give (0, 0, 0, 0, 0, 0) here.
        ([1, 1], [4, 6], 1, 3, (2, 0, 0, 2, 0, 0)),
    ],
    ids=["decode-extend-prefill", "decodes", "extends", "prefills", "overstated-max"],
)
def test_three_way_examples(query_lens, seq_lens, threshold, max_query_len, expected):
    batch = make_batch(query_lens, seq_lens, max_query_len=max_query_len)
    assert split_decodes_prefills_and_extends(batch, threshold) == expected


@settings(max_examples=2000)
@given(case=plan_cases(), uniform=st.booleans(), short_as_decodes=st.booleans())
def test_split_matches_oracle(case, uniform, short_as_decodes):
    expected = oracle.split_decodes_and_prefills(
        case.query_lens, case.num_actual_tokens, case.max_query_len, case.threshold, uniform,
        short_as_decodes, case.is_prefilling)
    got = split_decodes_and_prefills(batch_of(case), case.threshold, require_uniform=uniform,
                                     treat_short_extends_as_decodes=short_as_decodes)
    assert got == expected
    d, p, td, tp = got
    assert d + p == len(case.query_lens) and td + tp == case.num_actual_tokens


@settings(max_examples=2000)
@given(case=plan_cases())
def test_three_way_split_matches_oracle(case):
    expected = oracle.split_decodes_prefills_and_extends(
        case.query_lens, case.seq_lens, case.num_actual_tokens, case.max_query_len,
        case.threshold)
    got = split_decodes_prefills_and_extends(batch_of(case), case.threshold)
    assert got == expected
    d, e, p, td, te, tp = got
    assert d + e + p == len(case.query_lens) and td + te + tp == case.num_actual_tokens
