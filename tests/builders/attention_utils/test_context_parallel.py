"""Decode-context-parallel local sequence lengths (seed ``get_dcp_local_seq_lens``)."""

from __future__ import annotations

import pytest
import torch
from helpers import planning as oracle
from hypothesis import given, settings
from hypothesis import strategies as st

from staticattn.builders import get_dcp_local_seq_lens
from staticattn.errors import ConfigError, InvalidBatchError


def test_every_rank():
    # L = 10, 2 ranks, groups of 4: positions 0-3 rank 0, 4-7 rank 1, 8-9 rank 0.
    lens = torch.tensor([10, 3, 0, 8], dtype=torch.int32)
    got = get_dcp_local_seq_lens(lens, dcp_size=2, cp_kv_cache_interleave_size=4)
    assert got.dtype == torch.int32 and got.shape == (4, 2)
    assert got.tolist() == [[6, 4], [3, 0], [0, 0], [4, 4]]


def test_one_rank():
    lens = torch.tensor([10, 3, 0, 8], dtype=torch.int64)
    assert get_dcp_local_seq_lens(lens, 2, 1, 4).tolist() == [4, 0, 0, 4]
    assert get_dcp_local_seq_lens(lens, 3, 2, 1).tolist() == [3, 1, 0, 2]


def test_single_rank_is_the_sequence():
    lens = torch.tensor([7, 1], dtype=torch.int32)
    assert get_dcp_local_seq_lens(lens).tolist() == [7, 1]
    assert get_dcp_local_seq_lens(lens, dcp_rank=0).tolist() == [7, 1]


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    (dict(dcp_size=0), ConfigError, "dcp_size=0"),
    (dict(dcp_size=2, cp_kv_cache_interleave_size=0), ConfigError, "interleave_size=0"),
    (dict(dcp_size=2, dcp_rank=2), ConfigError, r"dcp_rank=2 is outside \[0, dcp_size=2\)"),
])
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        get_dcp_local_seq_lens(torch.tensor([4]), **kwargs)


def test_seq_lens_must_be_one_dimensional():
    with pytest.raises(InvalidBatchError, match="1-D"):
        get_dcp_local_seq_lens(torch.zeros(2, 2, dtype=torch.int32), 2)


@settings(max_examples=2000)
@given(lens=st.lists(st.integers(0, 400), max_size=8), dcp_size=st.integers(1, 8),
       interleave=st.sampled_from([1, 2, 4, 16, 64]), data=st.data())
def test_matches_oracle(lens, dcp_size, interleave, data):
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    expected = [oracle.dcp_local_seq_lens(n, dcp_size, interleave) for n in lens]
    every = get_dcp_local_seq_lens(seq_lens, dcp_size, None, interleave)
    if dcp_size > 1:
        assert every.tolist() == expected
    else:
        assert every.tolist() == [e[0] for e in expected]
    rank = data.draw(st.integers(0, dcp_size - 1))
    one = get_dcp_local_seq_lens(seq_lens, dcp_size, rank, interleave)
    assert one.tolist() == [e[rank] for e in expected]
