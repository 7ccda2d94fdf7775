"""Prefill chunk planning: workspace chunks (spec §3.3) and indexer chunks (spec §4.6)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import planning as oracle
from hypothesis import given, settings
from hypothesis import strategies as st

from staticattn.builders import split_indexer_prefill_chunks, split_prefill_chunks
from staticattn.errors import CapacityError


def _plain(chunks):
    return [((r.start, r.stop), (q.start, q.stop)) for r, q in chunks]


def test_workspace_example():
    assert split_prefill_chunks([2, 3, 4, 2], 5) == [(0, 2), (2, 3), (3, 4)]


def test_workspace_offset_and_inputs():
    lens = torch.tensor([2, 3, 4, 2], dtype=torch.int32)
    assert split_prefill_chunks(lens, 5, request_offset=3) == [(3, 5), (5, 6), (6, 7)]
    assert split_prefill_chunks(np.array([5, 5]), 5) == [(0, 1), (1, 2)]
    assert split_prefill_chunks([], 5) == []


def test_workspace_too_small_for_one_request():
    with pytest.raises(CapacityError, match=r"request 4 has 6 tokens.*workspace of 5"):
        split_prefill_chunks([1, 6], 5, request_offset=3)


def test_indexer_example_c():
    # N = [10,10,10], M = [5,5,5], E = 250: 10 x 20 = 200 fits, 15 x 30 = 450 does not.
    chunks = split_indexer_prefill_chunks([10, 10, 10], [5, 5, 5], 100, 1000)
    assert _plain(chunks) == [((0, 2), (0, 10)), ((2, 3), (0, 5))]


def test_indexer_example_d():
    chunks = split_indexer_prefill_chunks([100, 40, 3000], [100, 40, 300], 4000, 800_000,
                                          request_offset=2)
    assert _plain(chunks) == [((2, 4), (0, 140)), ((4, 5), (0, 66)), ((4, 5), (66, 132)),
                              ((4, 5), (132, 198)), ((4, 5), (198, 264)), ((4, 5), (264, 300))]


def test_indexer_single_request_overflow():
    # Request 0 alone is over the logits budget (100 x 1000 > 250): one query per chunk.
    chunks = _plain(split_indexer_prefill_chunks([1000, 50], [100, 5], 2000, 1000))
    assert chunks[:100] == [((0, 1), (i, i + 1)) for i in range(100)]
    assert chunks[100:] == [((1, 2), (0, 5))]


def test_indexer_request_over_the_workspace_is_taken_alone():
    chunks = _plain(split_indexer_prefill_chunks([30, 5], [2, 2], 20, 10_000))
    assert chunks == [((0, 1), (0, 2)), ((1, 2), (0, 2))]


def test_indexer_request_without_keys():
    assert _plain(split_indexer_prefill_chunks([0, 0], [3, 4], 10, 4)) == [((0, 2), (0, 7))]


@settings(max_examples=2000)
@given(lens=st.lists(st.integers(0, 300), max_size=14), workspace=st.integers(1, 700),
       offset=st.integers(0, 5))
def test_workspace_chunks_match_oracle(lens, workspace, offset):
    expected = oracle.split_prefill_chunks(lens, workspace, offset)
    if expected is None:
        with pytest.raises(CapacityError):
            split_prefill_chunks(lens, workspace, offset)
        return
    assert split_prefill_chunks(lens, workspace, offset) == expected


@settings(max_examples=2000)
@given(
    requests=st.lists(st.tuples(st.integers(0, 3000), st.integers(1, 150)), max_size=10),
    workspace=st.integers(1, 6000),
    max_logits_bytes=st.sampled_from([4, 1000, 40_000, 800_000, 4_000_000]),
    offset=st.integers(0, 5),
)
def test_indexer_chunks_match_oracle(requests, workspace, max_logits_bytes, offset):
    keys = [n for n, _ in requests]
    queries = [m for _, m in requests]
    got = _plain(split_indexer_prefill_chunks(keys, queries, workspace, max_logits_bytes,
                                              offset))
    assert got == oracle.split_indexer_prefill_chunks(keys, queries, workspace,
                                                      max_logits_bytes, offset)
    # Every query of every request is covered once, in order.
    covered = {}
    for (start, end), (q0, q1) in got:
        covered.setdefault((start, end), []).append((q0, q1))
    for (start, end), slices in covered.items():
        assert slices[0][0] == 0 and slices[-1][1] == sum(queries[start - offset:end - offset])
        assert all(a[1] == b[0] for a, b in zip(slices, slices[1:], strict=False))
