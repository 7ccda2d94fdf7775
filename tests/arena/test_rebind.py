"""A builder serves one arena for life: binding it to a second arena is an ``ArenaError``
naming both, raised before anything changes (the builder keeps handing out the first arena's
views, which graphs captured with it still read); binding again to the same arena is
harmless, and a new builder per arena writes into that arena only."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.support import DEVICE, make_step, stage

from staticattn.arena import ArenaConfig
from staticattn.builders import Batch, make_arena
from staticattn.builders.indexer.builder import IndexerMetadataBuilder
from staticattn.builders.swa.builder import SparseSWAMetadataBuilder
from staticattn.errors import ArenaError


def _tensors(obj):
    """Every tensor reachable from a metadata dataclass (nested dataclasses included)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif hasattr(obj, "__dataclass_fields__"):
        for name in obj.__dataclass_fields__:
            yield from _tensors(getattr(obj, name))


def _inside(arena, t: torch.Tensor) -> bool:
    block = arena.block("device")
    lo = block.data_ptr()
    return t.numel() == 0 or lo <= t.data_ptr() < lo + block.numel() * block.element_size()


def _cfg(n: int, backend: str = "torch") -> ArenaConfig:
    return ArenaConfig.deepseek_v4(max_num_seqs=8, max_num_batched_tokens=64,
                                   max_model_len=2048, num_speculative_tokens=n - 1,
                                   device=DEVICE, kernel_backend=backend)


def _owned_inside(arena, inputs, builders, step) -> None:
    """Every view a build hands out that is not the batch's own lies in ``arena``."""
    batch = stage(inputs, step)
    for b in builders:
        for meta in (b.build(batch), b.build_decode(Batch.for_decode_capture(inputs, 3))):
            owned = [t for t in _tensors(meta)
                     if not any(t.data_ptr() == v.data_ptr() for v in _tensors(batch))]
            assert owned and all(_inside(arena, t) for t in owned), b.name


@pytest.mark.parametrize("n", [1, 2])
def test_a_new_builder_per_arena_writes_into_its_own(backend, n):
    cfg = _cfg(n, backend)
    rng = np.random.default_rng(n)
    step = make_step(cfg, [n] * 3, rng.integers(n, 2048, 3), rng=rng)
    for _ in range(2):
        builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
        arena, inputs = make_arena(cfg, builders)
        assert all(b.arena is arena for b in builders)
        _owned_inside(arena, inputs, builders, step)


@pytest.mark.parametrize("builder_type", [IndexerMetadataBuilder, SparseSWAMetadataBuilder])
def test_binding_to_a_second_arena_is_refused_naming_both(builder_type):
    cfg = _cfg(2)
    first = builder_type()
    arena, inputs = make_arena(cfg, [first])
    other, _ = make_arena(cfg, [builder_type()])
    fingerprint = {k: v for k, v in vars(first).items() if isinstance(v, torch.Tensor)}
    with pytest.raises(ArenaError, match=f"'{first.name}' is bound to") as info:
        first.bind(other)
    assert repr(arena) in str(info.value) and repr(other) in str(info.value)
    assert repr(arena) != repr(other)  # each arena is named by its own device block
    assert first.arena is arena
    assert all(getattr(first, k) is v for k, v in fingerprint.items())  # nothing re-pointed
    first.bind(arena)  # the same arena again: allowed
    assert first.arena is arena
    rng = np.random.default_rng(0)
    _owned_inside(arena, inputs, [first], make_step(cfg, [2] * 3, rng.integers(2, 2048, 3),
                                                    rng=rng))


def test_make_arena_refuses_a_bound_builder_before_allocating():
    cfg = _cfg(1)
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, _ = make_arena(cfg, builders)
    with pytest.raises(ArenaError, match=r"'indexer' is already bound to Arena\(") as info:
        make_arena(cfg, builders)
    assert repr(arena) in str(info.value)
    assert all(b.arena is arena for b in builders)


def test_make_arena_records_the_arena_of_a_builder_whose_bind_does_not():
    class Plain:
        """A builder that takes its views and records nothing itself."""

        name = "plain"

        def buffers(self, config):
            return []

        def bind(self, arena) -> None:
            self.bound = True

    b = Plain()
    arena, _ = make_arena(_cfg(1), [b])
    assert b.bound and b.arena is arena
    with pytest.raises(ArenaError, match="'plain' is already bound"):
        make_arena(_cfg(1), [b])
