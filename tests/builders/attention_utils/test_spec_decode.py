"""Views between flat tokens and (batch, next_n, ...) for uniform speculative decodes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from staticattn.builders import (
    reshape_attn_output_for_spec_decode,
    reshape_query_for_spec_decode,
)
from staticattn.errors import InvalidBatchError


def test_query_view_of_any_strides():
    query = torch.zeros(8, 4, 6).transpose(0, 2)
    assert reshape_query_for_spec_decode(query, 2).data_ptr() == query.data_ptr()


def test_query_view():
    query = torch.arange(6 * 4 * 8, dtype=torch.float32).view(6, 4, 8)
    out = reshape_query_for_spec_decode(query, 3)
    assert out.shape == (3, 2, 4, 8)
    assert out.data_ptr() == query.data_ptr()
    assert torch.equal(out[1, 0], query[2])


def test_attn_output_view():
    out = torch.arange(3 * 2 * 4 * 8, dtype=torch.bfloat16).view(3, 2, 4, 8)
    flat = reshape_attn_output_for_spec_decode(out)
    assert flat.shape == (6, 4, 8) and flat.data_ptr() == out.data_ptr()
    assert torch.equal(flat[5], out[2, 1])
    already = torch.zeros(6, 4, 8)
    assert reshape_attn_output_for_spec_decode(already) is already


@pytest.mark.parametrize(("query", "batch_size", "match"), [
    (torch.zeros(6, 32), 3, r"3-D .* got shape \(6, 32\)"),
    (torch.zeros(7, 4, 8), 3, "num_tokens=7 is not a multiple of batch_size=3"),
    (torch.zeros(6, 4, 8), 0, "batch_size=0"),
])
def test_bad_query(query, batch_size, match):
    with pytest.raises(InvalidBatchError, match=match):
        reshape_query_for_spec_decode(query, batch_size)


@pytest.mark.parametrize(("out", "match"), [
    (torch.zeros(6, 32), r"3-D or 4-D .* got shape \(6, 32\)"),
    (torch.zeros(2, 3, 2, 4, 8), "3-D or 4-D"),
    (torch.zeros(4, 8, 2, 3).permute(3, 2, 0, 1), "cannot be viewed"),
])
def test_bad_attn_output(out, match):
    with pytest.raises(InvalidBatchError, match=match):
        reshape_attn_output_for_spec_decode(out)


@settings(max_examples=2000)
@given(batch=st.integers(1, 16), next_n=st.integers(1, 8), heads=st.integers(1, 4),
       head_dim=st.integers(1, 8))
def test_round_trip(batch, next_n, heads, head_dim):
    query = torch.randn(batch * next_n, heads, head_dim)
    shaped = reshape_query_for_spec_decode(query, batch)
    assert shaped.shape == (batch, next_n, heads, head_dim)
    for b in range(batch):
        for j in range(next_n):
            assert torch.equal(shaped[b, j], query[b * next_n + j])
    assert torch.equal(reshape_attn_output_for_spec_decode(shaped), query)
