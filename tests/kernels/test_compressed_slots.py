"""The compressed indexer-K slot mapping (spec §4.5): worked examples A and B, padding, and
random batches against the oracle, torch and Triton backends."""

from __future__ import annotations

import pytest
import torch
from helpers.support import DEVICE
from hypothesis import given, settings
from hypothesis import strategies as st

from staticattn.kernels.indexer.index_slots import compressed_slot_mapping
from staticattn.reference import indexer as oracle


def _run(backend, query_lens, seq_lens, block_table, storage_block_size, ratio, num_tokens=None,
         capacity=64):
    """Token views as the staging kernel derives them, then the kernel; returns the whole
    output buffer (prefilled with a sentinel to show what is not written)."""
    qsl, t2r, pos = [0], [], []
    for b, (q, L) in enumerate(zip(query_lens, seq_lens)):
        qsl.append(qsl[-1] + q)
        t2r += [b] * q
        pos += [L - q + j for j in range(q)]
    num_tokens = len(pos) if num_tokens is None else num_tokens
    t2r += [0] * (num_tokens - len(t2r))
    pos += [0] * (num_tokens - len(pos))
    out = torch.full((max(capacity, num_tokens),), -7, dtype=torch.int64, device=DEVICE)

    def t(values, dtype):
        return torch.tensor(values, dtype=dtype, device=DEVICE)

    compressed_slot_mapping(
        backend, t(qsl, torch.int32), t(pos, torch.int64), t(t2r, torch.int32),
        t(block_table, torch.int32), out,
        num_reqs=len(query_lens), num_tokens=num_tokens, storage_block_size=storage_block_size,
        compress_ratio=ratio,
    )
    return out


def test_example_a(backend):
    out = _run(backend, [40], [280], [[5, 7]], 64, 4)
    slots = out[:40].tolist()
    assert [s for s in slots if s >= 0] == [380, 381, 382, 383, 448, 449, 450, 451, 452, 453]
    assert sum(s == -1 for s in slots) == 30
    assert [slots[i] for i in range(3, 40, 4)] == [380, 381, 382, 383, 448, 449, 450, 451,
                                                   452, 453]
    assert out[40:].eq(-7).all(), "writes only [:num_tokens]"


def test_example_b(backend):
    out = _run(backend, [10, 3], [10, 9], [[3], [8]], 64, 4)
    assert out[:13].tolist() == [-1, -1, -1, 192, -1, -1, -1, 193, -1, -1, -1, 513, -1]


def test_padded_tokens_get_minus_one(backend):
    # Two real tokens completing a group, then six padded tokens (position 0 would complete
    # nothing for R=4, but a padded token must be -1 for any R).
    out = _run(backend, [2], [8], [[9]], 64, 4, num_tokens=8)
    assert out[:8].tolist() == [-1, 9 * 64 + 1] + [-1] * 6
    out = _run(backend, [2], [8], [[9]], 64, 1, num_tokens=8)
    assert out[:8].tolist() == [9 * 64 + 6, 9 * 64 + 7] + [-1] * 6


@st.composite
def _requests(draw):
    ratio = draw(st.sampled_from([1, 4, 128]))
    storage = draw(st.sampled_from([1, 2, 64])) if ratio == 128 else 256 // ratio
    num_reqs = draw(st.integers(1, 6))
    query_lens, seq_lens = [], []
    for _ in range(num_reqs):
        q = draw(st.integers(0, 40))
        query_lens.append(q)
        seq_lens.append(draw(st.integers(q, 3000)) if q else 0)
    cols = -(-3000 // (storage * ratio)) + 1
    table = [[draw(st.integers(1, 10_000)) for _ in range(cols)] for _ in range(num_reqs)]
    pad = draw(st.integers(0, 5))
    return ratio, storage, query_lens, seq_lens, table, pad


@pytest.mark.parametrize("backend_name", ["torch", "triton"])
def test_random_batches_match_oracle(backend_name):
    @settings(max_examples=25 if backend_name == "triton" else 150)
    @given(_requests())
    def check(case):
        ratio, storage, query_lens, seq_lens, table, pad = case
        num_tokens = sum(query_lens) + pad
        out = _run(backend_name, query_lens, seq_lens, table, storage, ratio,
                   num_tokens=num_tokens, capacity=num_tokens)
        qsl = [0]
        for q in query_lens:
            qsl.append(qsl[-1] + q)
        assert out.tolist() == oracle.compressed_slot_mapping(
            qsl, seq_lens, table, storage, ratio, num_tokens)

    check()
