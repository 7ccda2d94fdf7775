"""Graphs keyed by context bucket (``ContextGraphs``): the bucket ladder, the routing of a
step to the smallest bucket that holds its longest sequence, and on CPU the same results
whichever bucket runs the step (eagerly here; the GPU test replays)."""

from __future__ import annotations

import numpy as np
import pytest
from support import DEVICE
from toy import ToyBuilder, ToyStep, toy_expected

from staticattn.arena import ArenaConfig
from staticattn.builders import make_arena
from staticattn.errors import GraphError
from staticattn.graphs import ContextGraphs, default_context_buckets
from staticattn.graphs.contexts import normalize_context_buckets


def _cfg(max_model_len=16384):
    return ArenaConfig.deepseek_v4(max_num_seqs=16, max_num_batched_tokens=128,
                                   max_model_len=max_model_len, device=DEVICE)


def test_the_default_ladder_doubles_up_to_the_context_limit():
    assert default_context_buckets(_cfg(16384)) == [2048, 4096, 8192, 16384]
    assert default_context_buckets(_cfg(1 << 20))[-3:] == [262144, 524288, 1 << 20]
    assert default_context_buckets(_cfg(1024)) == [1024]
    assert normalize_context_buckets(_cfg(), [4096, 2048, 4096]) == [2048, 4096, 16384]
    with pytest.raises(GraphError, match="must be in"):
        normalize_context_buckets(_cfg(), [0])
    with pytest.raises(GraphError, match="must be in"):
        normalize_context_buckets(_cfg(), [32768])


def test_a_step_goes_to_the_smallest_bucket_that_holds_it():
    cfg = _cfg()
    b = ToyBuilder()
    arena, inputs = make_arena(cfg, [b])
    cg = ContextGraphs(arena, inputs, [b], ToyStep(cfg, arena.device), progress=False)
    assert [m.context_len for m in cg.managers] == [2048, 4096, 8192, 16384]
    cg._top = [64, 64, 64, 64]  # as after capturing decode graphs of up to 64 tokens
    assert cg.manager_for(2048, 8) is cg.managers[0]
    assert cg.manager_for(2049, 8) is cg.managers[1]
    assert cg.manager_for(16384, 8) is cg.managers[3]
    assert cg.manager_for(100, 128) is cg.managers[3]  # past the decode graphs: the widest


def test_every_bucket_computes_the_same_step():
    cfg = _cfg()
    b = ToyBuilder()
    arena, inputs = make_arena(cfg, [b])
    rng = np.random.default_rng(0)
    with ContextGraphs(arena, inputs, [b], ToyStep(cfg, arena.device), progress=False) as cg:
        for _ in range(20):
            k = int(rng.integers(1, 9))
            q = np.full(k, cfg.next_n)
            s = rng.integers(cfg.next_n, cfg.max_model_len + 1, size=k)
            res = cg.run(q, s, np.arange(k * cfg.next_n))
            assert res.outputs.tolist() == toy_expected(q, s)
        assert cg.stats.eager_total == 20
        assert "context bucket 2,048 tokens" in cg.describe()
