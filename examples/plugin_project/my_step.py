"""The user's step under test, and the same step with a planted bug.

``MyStep(batch, metadata)``: ``out[t] = positions[t] + seq_lens[token_to_req[t]]`` for every
real token, into an int64 ``(max_num_batched_tokens,)`` buffer it owns; graph-safe (fixed
buffers, no host read). ``MyStepWithSync`` adds a Python branch on ``.item()`` of a device
value: a host sync, forbidden inside a capture, which the checker reports."""

from __future__ import annotations

import torch

from staticattn.arena import ArenaConfig


def config(**overrides) -> ArenaConfig:
    """A small DeepSeek-V4-like arena: 16 requests, 64 tokens, 8K context."""
    return ArenaConfig.deepseek_v4(**{"max_model_len": 8192, "max_num_seqs": 16,
                                      "max_num_batched_tokens": 64, **overrides})


class MyStep:
    """The fixed step: reads the batch's device views only."""

    def __init__(self, cfg: ArenaConfig) -> None:
        t = cfg.max_num_batched_tokens
        self.per_token = torch.zeros(t, dtype=torch.int32, device=cfg.torch_device)
        self.out = torch.zeros(t, dtype=torch.int64, device=cfg.torch_device)

    def __call__(self, batch, metadata) -> torch.Tensor:
        n = batch.num_actual_tokens
        torch.index_select(batch.seq_lens, 0, batch.token_to_req, out=self.per_token[:n])
        torch.add(batch.positions, self.per_token[:n], out=self.out[:n])
        return self.out[:n]


class MyStepWithSync(MyStep):
    """The planted bug: a branch on ``.item()`` (the host waits for the device, and a
    replay would keep the branch taken at capture time)."""

    def __call__(self, batch, metadata) -> torch.Tensor:
        out = super().__call__(batch, metadata)
        if batch.seq_lens[0].item() > 1_000_000:
            out.zero_()
        return out
