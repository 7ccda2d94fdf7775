"""Decode -> short extend -> long extend -> prefill reorder (spec §3.1)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import planning as oracle
from hypothesis import given, settings
from hypothesis import strategies as st

from staticattn.builders import (
    ListReorderState,
    ReorderState,
    reorder_batch_to_split_decodes_and_prefills,
)


def _state(requests: list[tuple[int, int, int]]) -> ListReorderState:
    return ListReorderState(
        req_ids=list(range(len(requests))),
        num_scheduled=[r[0] for r in requests],
        num_computed=[r[1] for r in requests],
        num_prompt=[r[2] for r in requests],
    )


def _done(scheduled: int, computed: int) -> tuple[int, int, int]:
    """A request whose prompt is done (or, without context, a fresh prefill)."""
    return scheduled, computed, computed if computed else scheduled


# The reference's own cases (§12), all prompts done, so three and four regions agree.
REFERENCE_CASES = {
    "all_decodes": ([(1, 10), (1, 20), (1, 30)], [0, 1, 2], False, 1),
    "all_prefills": ([(100, 100), (200, 200), (300, 300)], [0, 1, 2], False, 1),
    "mixed_interleaved": ([(100, 100), (1, 10), (200, 200), (1, 20)], [3, 1, 2, 0], True, 1),
    "already_ordered": ([(1, 10), (1, 20), (100, 100), (200, 0)], [0, 1, 2, 3], False, 1),
    "single_request": ([(1, 10)], [0], False, 1),
    "higher_threshold": ([(2, 10), (3, 20), (5, 30), (6, 40)], [0, 1, 2, 3], False, 4),
    "decodes_at_end": ([(100, 100), (200, 200), (1, 10), (1, 20)], [2, 3, 0, 1], True, 1),
    "decode_extend_prefill": ([(100, 0), (10, 50), (1, 10)], [2, 1, 0], True, 1),
    "extend_prefill_only": ([(100, 0), (10, 50), (200, 0), (20, 75)], [3, 1, 2, 0], True, 1),
    "complicated_mixed_interleaved": (
        [(1, 20), (1, 50), (374, 0), (300, 20), (1, 20), (256, 0), (1, 5), (27, 0), (1, 4)],
        [0, 1, 6, 8, 4, 3, 2, 7, 5], True, 1),
}


@pytest.mark.parametrize("name", list(REFERENCE_CASES))
def test_reference_cases(name):
    requests, expected, modified, threshold = REFERENCE_CASES[name]
    state = _state([_done(s, c) for s, c in requests])
    assert reorder_batch_to_split_decodes_and_prefills(state, threshold) is modified
    assert state.req_ids == expected


def test_four_regions():
    # (scheduled, computed, prompt): prefill, decode, short extend, long extend.
    state = _state([(5, 0, 5), (1, 10, 10), (1, 3, 8), (4, 3, 8)])
    assert reorder_batch_to_split_decodes_and_prefills(state, 1)
    assert state.req_ids == [1, 2, 3, 0]


def test_short_extend_goes_after_decodes():
    # v0.14 called both of these decodes and left them alone; v0.20.2 moves the short
    # chunked-prefill continuation behind the finished decode.
    state = _state([(1, 3, 8), (1, 10, 10)])
    assert reorder_batch_to_split_decodes_and_prefills(state, 1)
    assert state.req_ids == [1, 0]


def test_mtp_decodes_under_threshold_one_are_long_extends():
    # Spec §3.1: with the runner's threshold 1, MTP decodes (2 tokens) share region 2 with
    # chunked prefills, in their previous relative order.
    state = _state([(2, 30, 30), (50, 10, 100), (2, 40, 40), (1, 9, 9)])
    assert reorder_batch_to_split_decodes_and_prefills(state, 1)
    assert state.req_ids == [3, 1, 2, 0]


def test_only_misplaced_positions_are_swapped():
    requests = [(1, 0, 1), (1, 5, 5), (9, 5, 20), (1, 7, 7), (3, 0, 3), (1, 2, 9)]
    state = _state(requests)
    order, _ = oracle.reorder(requests, 1)
    misplaced = {i for i in range(len(requests)) if order[i] != i}
    assert reorder_batch_to_split_decodes_and_prefills(state, 1)
    touched = {i for pair in state.swaps for i in pair}
    assert touched <= misplaced
    assert len(state.swaps) <= len(misplaced) - 1
    assert state.req_ids == order


class ArrayBatch:
    """An engine-like persistent batch: numpy columns, swap exchanges rows."""

    def __init__(self, scheduled, computed, prompt):
        self.columns = np.array([scheduled, computed, prompt, range(len(scheduled))])

    @property
    def num_reqs(self) -> int:
        return self.columns.shape[1]

    @property
    def num_scheduled(self):
        return self.columns[0]

    @property
    def num_computed(self):
        return self.columns[1]

    @property
    def num_prompt(self):
        return self.columns[2]

    def swap_states(self, i: int, j: int) -> None:
        self.columns[:, [i, j]] = self.columns[:, [j, i]]


def test_protocol_over_numpy_columns():
    state = ArrayBatch([100, 1, 200, 1], [0, 10, 5, 20], [100, 10, 300, 20])
    assert isinstance(state, ReorderState)
    assert reorder_batch_to_split_decodes_and_prefills(state, 1)
    assert state.columns[3].tolist() == [3, 1, 2, 0]


requests = st.lists(
    st.tuples(st.integers(1, 8), st.sampled_from([0, 0, 1, 3, 8, 50]), st.integers(1, 60)),
    max_size=40,
)


@settings(max_examples=2000)
@given(requests=requests, threshold=st.integers(1, 5))
def test_matches_oracle(requests, threshold):
    expected_order, expected_modified = oracle.reorder(requests, threshold)
    state = _state(requests)
    assert reorder_batch_to_split_decodes_and_prefills(state, threshold) is expected_modified
    assert state.req_ids == expected_order
    regions = [oracle.reorder_region(s, c, p, threshold)
               for s, c, p in zip(state.num_scheduled, state.num_computed, state.num_prompt,
                                  strict=True)]
    assert regions == sorted(regions)
    assert len(state.swaps) <= max(0, sum(o != i for i, o in enumerate(expected_order)) - 1)
