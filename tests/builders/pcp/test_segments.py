"""``segment_of``: each index's segment under prefix sums, against a plain loop over random
segment lengths (empty segments included), batched along a leading dimension as the rank
rows use it."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from staticattn.builders.pcp.segments import segment_of


def _oracle(cu: list[int], i: int) -> int:
    """The segment ``s`` with ``cu[s] <= i < cu[s + 1]``; past the end, the last one."""
    S = len(cu) - 1
    for s in range(S):
        if cu[s] <= i < cu[s + 1]:
            return s
    return S - 1


@given(st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=6), min_size=1, max_size=3)
       .filter(lambda rows: len({len(r) for r in rows}) == 1), st.integers(0, 3))
def test_each_index_lands_in_its_segment(lengths, extra):
    cus = [[0] + torch.tensor(r).cumsum(0).tolist() for r in lengths]
    width = max(c[-1] for c in cus) + extra
    index = torch.arange(width).expand(len(cus), width).contiguous()
    got = segment_of(torch.tensor(cus), index)
    assert got.tolist() == [[_oracle(c, i) for i in range(width)] for c in cus]
    # One prefix-sum array, as the single-row callers pass it.
    assert segment_of(torch.tensor(cus[0]), torch.arange(width)).tolist() == [
        _oracle(cus[0], i) for i in range(width)]
