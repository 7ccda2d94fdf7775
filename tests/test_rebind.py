"""A builder bound to a second arena writes into that arena only: every view it hands out
after the new binding lies in the new arena's device block (a view kept from the first
binding would be a stale pointer)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import DEVICE, make_step, stage

from staticattn.arena import ArenaConfig
from staticattn.builders import Batch, make_arena
from staticattn.builders.indexer.builder import IndexerMetadataBuilder
from staticattn.builders.swa.builder import SparseSWAMetadataBuilder


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


@pytest.mark.parametrize("n", [1, 2])
def test_views_follow_the_new_binding(backend, n):
    cfg = ArenaConfig.deepseek_v4(max_num_seqs=8, max_num_batched_tokens=64,
                                  max_model_len=2048, num_speculative_tokens=n - 1,
                                  device=DEVICE, kernel_backend=backend)
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    rng = np.random.default_rng(n)
    step = make_step(cfg, [n] * 3, rng.integers(n, 2048, 3), rng=rng)
    for _ in range(2):  # the second binding replaces the first
        arena, inputs = make_arena(cfg, builders)
        batch = stage(inputs, step)
        for b in builders:
            for meta in (b.build(batch), b.build_decode(Batch.for_decode_capture(inputs, 3))):
                owned = [t for t in _tensors(meta)
                         if not any(t.data_ptr() == v.data_ptr() for v in _tensors(batch))]
                assert owned and all(_inside(arena, t) for t in owned), b.name
