"""The arena: one allocation, aligned non-overlapping views, frozen, typed misuse errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.support import make_step, stage

from staticattn.arena import ALIGNMENT, Arena, ArenaConfig, BufferDecl
from staticattn.builders import make_arena
from staticattn.errors import ArenaError, CapacityError, InvalidBatchError
from staticattn.staging import input_buffers


def small_config(**kw) -> ArenaConfig:
    base = dict(max_num_seqs=16, max_num_batched_tokens=128, max_model_len=1024, device="cpu")
    base.update(kw)
    return ArenaConfig.deepseek_v4(**base)


def _arena() -> Arena:
    arena = Arena(small_config())
    arena.declare(input_buffers(arena.config))
    arena.declare(
        BufferDecl("t.odd", (3, 5), torch.int8),
        BufferDecl("t.empty", (0,), torch.int64),
        BufferDecl("t.bools", (7,), torch.bool, fill=None),
        BufferDecl("t.host", (9,), torch.int32, where="host", fill=-1),
    )
    arena.allocate()
    return arena


def test_every_view_inside_one_allocation_aligned_and_disjoint():
    arena = _arena()
    spans = {"device": [], "host": []}
    for name in arena.names():
        view = arena[name]
        if view.numel() == 0:  # owns no bytes; torch reports address 0
            continue
        where = arena.decl(name).where
        block = arena.block(where)
        base, end = block.data_ptr(), block.data_ptr() + block.numel()
        start = view.data_ptr()
        assert (start - base) % ALIGNMENT == 0, name
        assert base <= start and start + view.nbytes <= end, name
        assert view.untyped_storage().data_ptr() == block.untyped_storage().data_ptr(), name
        assert view.is_contiguous()
        spans[where].append((start, start + view.nbytes, name))
    for where, items in spans.items():
        items.sort()
        for (s0, e0, n0), (s1, e1, n1) in zip(items, items[1:]):
            assert e0 <= s1 or s0 == e0 or s1 == e1, f"{n0} overlaps {n1} in {where}"


def test_views_are_the_same_tensors_and_initialised():
    arena = _arena()
    assert arena["t.odd"] is arena["t.odd"]
    assert torch.equal(arena["t.host"], torch.full((9,), -1, dtype=torch.int32))
    slots = arena["input.slot_mapping"]
    assert torch.equal(slots, torch.full_like(slots, -1))
    assert arena["t.odd"].shape == (3, 5) and arena["t.odd"].dtype == torch.int8


def test_describe_lists_every_buffer_and_the_total():
    arena = _arena()
    text = arena.describe()
    for name in arena.names():
        assert name in text
    assert "total:" in text.splitlines()[-1]
    assert arena.nbytes() == arena.block("device").numel() + arena.block("host").numel()


@pytest.mark.parametrize(
    "misuse, match",
    [
        (lambda a: a.declare(BufferDecl("x", (1,), torch.int32)), "already allocated"),
        (lambda a: a.allocate(), "already called"),
        (lambda a: a["nope"], "unknown buffer"),
        (lambda a: a.decl("nope"), "unknown buffer"),
    ],
)
def test_misuse_after_allocation_raises_typed_errors(misuse, match):
    arena = _arena()
    before = arena.fingerprint()
    with pytest.raises(ArenaError, match=match):
        misuse(arena)
    assert arena.fingerprint() == before


def test_declaration_errors():
    arena = Arena(small_config())
    arena.declare(BufferDecl("a", (2,), torch.int32))
    with pytest.raises(ArenaError, match="declared twice"):
        arena.declare(BufferDecl("a", (3,), torch.int32))
    with pytest.raises(ArenaError, match="declared twice"):
        arena.declare([BufferDecl("b", (1,), torch.int32), BufferDecl("b", (1,), torch.int32)])
    assert "b" not in arena, "a rejected declaration must not be half-applied"
    with pytest.raises(ArenaError, match="before allocate"):
        arena["a"]
    with pytest.raises(ArenaError, match="negative"):
        BufferDecl("neg", (-1,), torch.int32)
    with pytest.raises(ArenaError, match="not device or host"):
        BufferDecl("w", (1,), torch.int32, where="gpu")
    with pytest.raises(ArenaError, match="not a torch.dtype"):
        BufferDecl("d", (1,), "int32")
    with pytest.raises(ArenaError, match="not a BufferDecl"):
        arena.declare(["oops"])


def test_fingerprint_unchanged_after_many_staged_steps():
    cfg = small_config()
    arena, inputs = make_arena(cfg)
    before = arena.fingerprint()
    rng = np.random.default_rng(1)
    for _ in range(50):
        k = int(rng.integers(1, 8))
        q = rng.integers(1, 5, size=k)
        seq = q + rng.integers(0, 500, size=k)
        stage(inputs, make_step(cfg, q, seq, rng=rng, num_reqs_padded=8,
                                num_tokens_padded=int(q.sum()) + 3))
    assert arena.fingerprint() == before


@pytest.mark.parametrize(
    "query_lens, seq_lens, slots, pad, err",
    [
        ([1] * 17, [5] * 17, [0] * 17, {}, CapacityError),
        ([100, 29], [200, 200], [0] * 129, {}, CapacityError),
        ([2], [5], [0, 1], {"num_reqs_padded": 17}, CapacityError),
        ([2], [5], [0, 1], {"num_tokens_padded": 129}, CapacityError),
        ([2], [5], [0, 1, 2], {}, InvalidBatchError),
        ([2, 1], [5], [0, 1, 2], {}, InvalidBatchError),
        ([-1, 2], [5, 5], [0], {}, InvalidBatchError),
        ([2], [5], [0, 1], {"num_reqs_padded": 0}, InvalidBatchError),
        ([[2]], [[5]], [0, 1], {}, InvalidBatchError),
        ([2.0], [5.0], [0.0, 1.0], {}, InvalidBatchError),
    ],
)
def test_stage_rejects_bad_extents_before_writing(query_lens, seq_lens, slots, pad, err):
    arena, inputs = make_arena(small_config())
    stage(inputs, make_step(inputs.config, [3, 1], [9, 4]))
    host = {n: arena[n].clone() for n in arena.names()}
    with pytest.raises(err):
        inputs.stage(np.array(query_lens), np.array(seq_lens), np.array(slots), **pad)
    for n, v in host.items():
        assert torch.equal(arena[n], v), f"{n} was written by a rejected stage()"
