"""Chunked local attention as virtual requests (the seed's worked example and the oracle)."""

from __future__ import annotations

import random

import pytest
import torch
from helpers import planning as oracle
from helpers.planning import make_batch
from hypothesis import given, settings
from hypothesis import strategies as st

from staticattn.builders import make_local_attention_virtual_batches
from staticattn.errors import ConfigError, InvalidBatchError

SEED_TABLE = [[10 * b + i for i in range(10)] for b in range(3)]


def test_seed_example():
    batch = make_batch([4, 10, 5], [6, 17, 9], block_table=SEED_TABLE)
    virtual, make_block_table = make_local_attention_virtual_batches(4, batch, 2)
    assert virtual.num_reqs == 8
    assert virtual.query_start_loc_cpu.tolist() == [0, 2, 4, 5, 9, 13, 14, 18, 19]
    assert virtual.query_start_loc.tolist() == [0, 2, 4, 5, 9, 13, 14, 18, 19]
    assert virtual.seq_lens_cpu.tolist() == [4, 2, 4, 4, 4, 1, 4, 1]
    assert virtual.seq_lens.tolist() == [4, 2, 4, 4, 4, 1, 4, 1]
    assert virtual.block_table.tolist() == [
        [0, 1], [2, 3], [12, 13], [14, 15], [16, 17], [18, 19], [22, 23], [24, 25]]
    assert (virtual.max_query_len, virtual.max_seq_len) == (4, 4)
    assert virtual.num_actual_tokens == 19
    assert virtual.slot_mapping is batch.slot_mapping
    assert virtual.query_start_loc_cpu.dtype == virtual.seq_lens_cpu.dtype == torch.int32
    # The builder gathers the same entries from an updated table.
    moved = make_block_table(batch.block_table + 1000)
    assert torch.equal(moved, virtual.block_table + 1000)


def test_last_chunk_columns_clamp_to_the_table():
    # L = 5, A = 4, block 2: the last chunk starts at key 4 (column 2) and would also read
    # column 3, which a 3-column table does not have: clamped to column 2.
    batch = make_batch([5], [5], block_table=[[7, 8, 9]])
    virtual, _ = make_local_attention_virtual_batches(4, batch, 2)
    assert virtual.query_start_loc_cpu.tolist() == [0, 4, 5]
    assert virtual.seq_lens_cpu.tolist() == [4, 1]
    assert virtual.block_table.tolist() == [[7, 8], [9, 9]]


def test_padding_row_is_an_empty_virtual_request():
    batch = make_batch([3, 0], [3, 0], num_actual_tokens=4, block_table=[[5, 6], [0, 0]])
    virtual, _ = make_local_attention_virtual_batches(2, batch, 1)
    assert virtual.query_start_loc_cpu.tolist() == [0, 2, 3, 3]
    assert virtual.seq_lens_cpu.tolist() == [2, 1, 0]
    assert virtual.block_table.tolist() == [[5, 6], [6, 6], [0, 0]]
    assert virtual.num_actual_tokens == 4


def test_chunk_must_be_whole_blocks():
    batch = make_batch([1], [1])
    with pytest.raises(ConfigError, match="attn_chunk_size=6 is not a multiple of block_size=4"):
        make_local_attention_virtual_batches(6, batch, 4)
    with pytest.raises(ConfigError):
        make_local_attention_virtual_batches(4, batch, 0)


def test_query_longer_than_sequence():
    with pytest.raises(InvalidBatchError, match="schedules 4 tokens.*sequence length 3"):
        make_local_attention_virtual_batches(4, make_batch([4], [3]), 2)


@st.composite
def local_cases(draw):
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    chunk = block_size * draw(st.integers(1, 4))
    reqs = draw(st.lists(st.tuples(st.integers(1, 40), st.integers(0, 60)), max_size=8))
    q = [n for n, _ in reqs]
    s = [n + c for n, c in reqs]
    pad = draw(st.integers(0, 2))
    q += [0] * pad
    s += [0] * pad
    width = -(-max(s, default=0) // block_size) + draw(st.integers(0, 2))
    width = max(width, 1)
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    table = [[rng.randrange(1000) for _ in range(width)] for _ in q]
    return q, s, chunk, block_size, table


@settings(max_examples=2000)
@given(case=local_cases())
def test_matches_oracle(case):
    q, s, chunk, block_size, table = case
    batch = make_batch(q, s, block_table=table)
    virtual, make_block_table = make_local_attention_virtual_batches(chunk, batch, block_size)
    expected = oracle.local_attention(q, s, chunk, block_size, table)
    got_q = [virtual.query_start_loc_cpu[i + 1].item() - virtual.query_start_loc_cpu[i].item()
             for i in range(virtual.num_reqs)]
    assert got_q == [e[0] for e in expected]
    assert virtual.seq_lens_cpu.tolist() == [e[1] for e in expected]
    assert virtual.block_table.tolist() == [e[2] for e in expected]
    assert virtual.query_start_loc_cpu[-1].item() == sum(q)
    assert virtual.max_query_len == max((e[0] for e in expected), default=0)
    assert torch.equal(make_block_table(batch.block_table), virtual.block_table)
