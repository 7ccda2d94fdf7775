"""A user's test suite: is my step safe to capture in a CUDA graph?"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from my_step import MyStep, MyStepWithSync, config

from staticattn import (
    EagerBuild,
    GraphManager,
    GraphOptions,
    IndexerMetadataBuilder,
    SparseSWAMetadataBuilder,
    make_arena,
)
from staticattn.checks.pytest_plugin import GraphSafetyError


def test_my_step_computes_its_definition():
    """Eagerly, on any machine: ``out[t] = positions[t] + seq_lens[request of t]``."""
    cfg = config(device="cuda" if torch.cuda.is_available() else "cpu")
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    query_lens, seq_lens = np.array([2, 2, 7]), np.array([40, 9, 7])
    options = GraphOptions(progress=False, num_kv_blocks=4096)  # the KV pool's blocks
    with GraphManager(arena, inputs, builders, MyStep(cfg), options) as gm:
        out = gm.run(query_lens, seq_lens, np.arange(int(query_lens.sum())),
                     eager=EagerBuild.REFERENCE).outputs
        want = [int(length) - int(q) + j + int(length)
                for q, length in zip(query_lens, seq_lens) for j in range(int(q))]
        assert out.tolist() == want


def test_my_step_is_graph_safe(assert_graph_safe):
    cfg = config()
    report = assert_graph_safe(MyStep(cfg), config=cfg, sizes=[2, 16], batches=10)
    assert report.ok and not report.errors
    assert [s.size for s in report.sizes] == [2, 16]


def test_a_sync_is_reported(assert_graph_safe):
    cfg = config()
    with pytest.raises(GraphSafetyError) as failed:
        assert_graph_safe(MyStepWithSync(cfg), config=cfg, sizes=[2], batches=2)
    assert "sync" in failed.value.report.kinds("error")
    assert "FAIL" in str(failed.value)
