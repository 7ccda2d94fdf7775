"""Causal-conv1d launch metadata in arena views (seed ``compute_causal_conv1d_metadata``)."""

from __future__ import annotations

import pytest
import torch
from helpers import planning as oracle
from hypothesis import given, settings
from hypothesis import strategies as st

from staticattn.arena import Arena, ArenaConfig
from staticattn.builders import (
    CONV1D_BLOCK_M,
    compute_causal_conv1d_metadata,
    conv1d_buffers,
    max_conv1d_programs,
)
from staticattn.errors import CapacityError, InvalidBatchError

CONFIG = ArenaConfig(device="cpu", max_num_seqs=16, max_num_batched_tokens=256,
                     max_model_len=1024, block_size=16)


@pytest.fixture(scope="module")
def arena() -> Arena:
    arena = Arena(CONFIG)
    arena.declare(conv1d_buffers(CONFIG))
    arena.allocate()
    return arena


def test_buffers_are_sized_from_the_config():
    decls = {d.name: d for d in conv1d_buffers(CONFIG)}
    # cdiv(256, 8) + 16: every request may add one partial block.
    assert max_conv1d_programs(CONFIG) == 48
    for name in ("conv1d.batch_ptr", "conv1d.token_chunk_offset_ptr"):
        assert decls[name].shape == (48,)
        assert decls[name].dtype == torch.int32
        assert decls[name].fill == -1


def test_example(arena):
    nums_dict, batch_ptr, offset_ptr = compute_causal_conv1d_metadata(
        torch.tensor([0, 3, 20, 28], dtype=torch.int32), arena)
    entry = nums_dict[CONV1D_BLOCK_M]
    assert entry["nums"].tolist() == [1, 3, 1]
    assert entry["tot"] == entry["mlist_len"] == 5
    assert entry["mlist"].tolist() == [0, 1, 1, 1, 2]
    assert entry["offsetlist"].tolist() == [0, 0, 1, 2, 0]
    assert batch_ptr is arena["conv1d.batch_ptr"] is entry["batch_ptr"]
    assert offset_ptr is arena["conv1d.token_chunk_offset_ptr"]
    assert batch_ptr.tolist() == [0, 1, 1, 1, 2] + [-1] * 43
    assert offset_ptr.tolist() == [0, 0, 1, 2, 0] + [-1] * 43


def test_views_never_move(arena):
    before = arena.fingerprint()
    compute_causal_conv1d_metadata([0, 256], arena)
    compute_causal_conv1d_metadata([0] + [1] * 16, arena)
    assert arena.fingerprint() == before
    # 16 requests of 9 tokens: two programs each, the second one partial.
    nums_dict, _, _ = compute_causal_conv1d_metadata([0] + [9 * (i + 1) for i in range(16)],
                                                     arena)
    assert nums_dict[CONV1D_BLOCK_M]["tot"] == 32


def test_too_many_programs_writes_nothing(arena):
    compute_causal_conv1d_metadata([0, 8], arena)
    snapshot = arena.block("device").clone()
    with pytest.raises(CapacityError, match=r"125 causal-conv1d programs exceed the 48"):
        compute_causal_conv1d_metadata([0, 1000], arena)
    assert torch.equal(arena.block("device"), snapshot)


@pytest.mark.parametrize(("qsl", "match"), [
    (torch.zeros(3, dtype=torch.int32, device="meta"), "on meta"),
    ([[0, 1]], "1-D"),
    ([0, 5, 3], "decreases at request 1: 5 -> 3"),
])
def test_bad_query_start_locations(arena, qsl, match):
    with pytest.raises(InvalidBatchError, match=match):
        compute_causal_conv1d_metadata(qsl, arena)


query_lens = st.lists(st.integers(0, 40), max_size=CONFIG.max_num_seqs).filter(
    lambda q: sum(q) <= CONFIG.max_num_batched_tokens)


@settings(max_examples=2000)
@given(query_lens=query_lens, start=st.integers(0, 50))
def test_matches_oracle(arena, query_lens, start):
    qsl = [start]
    for q in query_lens:
        qsl.append(qsl[-1] + q)
    nums, mlist, offsets = oracle.conv1d(qsl, CONV1D_BLOCK_M)
    nums_dict, batch_ptr, offset_ptr = compute_causal_conv1d_metadata(
        torch.tensor(qsl, dtype=torch.int32), arena)
    entry = nums_dict[CONV1D_BLOCK_M]
    assert entry["nums"].tolist() == nums
    assert entry["mlist"].tolist() == mlist
    assert entry["offsetlist"].tolist() == offsets
    assert entry["tot"] == len(mlist) <= max_conv1d_programs(CONFIG)
    pad = [-1] * (batch_ptr.shape[0] - len(mlist))
    assert batch_ptr.tolist() == mlist + pad
    assert offset_ptr.tolist() == offsets + pad
