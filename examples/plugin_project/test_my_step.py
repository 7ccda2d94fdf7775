"""A user's test suite: is my step safe to capture in a CUDA graph?"""

from __future__ import annotations

import pytest
import torch

from staticattn.arena import ArenaConfig
from staticattn.checks.pytest_plugin import GraphSafetyError


class MyStep:
    """out[t] = positions[t] + seq_lens[token_to_req[t]], into an output buffer it owns:
    int64 ``(max_num_batched_tokens,)``; graph-safe (fixed buffers, no host read)."""

    def __init__(self, config: ArenaConfig) -> None:
        t = config.max_num_batched_tokens
        self.per_token = torch.zeros(t, dtype=torch.int32, device=config.torch_device)
        self.out = torch.zeros(t, dtype=torch.int64, device=config.torch_device)

    def __call__(self, batch, metadata) -> torch.Tensor:
        n = batch.num_actual_tokens
        torch.index_select(batch.seq_lens, 0, batch.token_to_req, out=self.per_token[:n])
        torch.add(batch.positions, self.per_token[:n], out=self.out[:n])
        return self.out[:n]


class MyStepWithSync(MyStep):
    """The same step with a sync: a Python branch on ``.item()`` of a device value."""

    def __call__(self, batch, metadata) -> torch.Tensor:
        out = super().__call__(batch, metadata)
        if batch.seq_lens[0].item() > 1_000_000:
            out.zero_()
        return out


def _config() -> ArenaConfig:
    return ArenaConfig.deepseek_v4(max_model_len=8192, max_num_seqs=16,
                                   max_num_batched_tokens=64)


def test_my_step_is_graph_safe(assert_graph_safe):
    cfg = _config()
    report = assert_graph_safe(MyStep(cfg), config=cfg, sizes=[2, 16], batches=10)
    assert report.ok and not report.errors
    assert [s.size for s in report.sizes] == [2, 16]


def test_a_sync_is_reported(assert_graph_safe):
    cfg = _config()
    with pytest.raises(GraphSafetyError) as failed:
        assert_graph_safe(MyStepWithSync(cfg), config=cfg, sizes=[2], batches=2)
    assert "sync" in failed.value.report.kinds("error")
    assert "FAIL" in str(failed.value)
