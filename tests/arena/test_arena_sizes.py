"""The device arena's size at a preset's defaults, in bytes (deterministic: the declarations
decide it). DeepSeek V4 at its defaults (1M context, 8,192 tokens a step) stays within 96 MiB:
its C128A prefill rows take a workspace of ``dense_prefill_workspace_bytes`` (16 MiB), not a
``(T, maxC)`` buffer (256 MiB), and the workspace does not grow with ``max_model_len``."""

from __future__ import annotations

import pytest

from staticattn.arena import ArenaConfig
from staticattn.builders import default_builders, make_arena
from staticattn.builders.swa.declarations import dense_prefill_chunk_rows

MIB = 1 << 20


def device_bytes(config: ArenaConfig) -> int:
    arena, _ = make_arena(config, default_builders(config))
    return arena.nbytes("device")


def test_the_v4_arena_at_its_defaults_is_at_most_96_mib():
    cfg = ArenaConfig.preset("deepseek-v4", device="cpu")
    size = device_bytes(cfg)
    print(f"deepseek-v4 device arena at its defaults: {size:,} bytes ({size / MIB:.1f} MiB)")
    assert size <= 96 * MIB
    # The (T, maxC) layout is one chunk of a whole step: 8,192 rows of 8,192 entries and a
    # length each, where the workspace holds 512.
    assert cfg.dense_width == 8192 and dense_prefill_chunk_rows(cfg) == 512
    whole_step = cfg.replace(dense_prefill_workspace_bytes=4 * 8192 * cfg.dense_width)
    assert device_bytes(whole_step) - size == (8192 - 512) * (8192 + 1) * 4


@pytest.mark.parametrize("max_model_len", [1 << 17, 1 << 20, 1 << 21])
def test_the_workspace_does_not_grow_with_the_context(max_model_len):
    """Longer contexts make wider rows and shorter chunks; the workspace stays its budget."""
    cfg = ArenaConfig.preset("deepseek-v4", device="cpu", max_model_len=max_model_len)
    arena, _ = make_arena(cfg, default_builders(cfg))
    rows = arena.decl("swa.dense_prefill_indices")
    assert rows.shape == (16 * MIB // (4 * cfg.dense_width), cfg.dense_width)
    assert rows.nbytes == 16 * MIB
