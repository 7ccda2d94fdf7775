"""On the GPU: a drafter kernel decides each request's query length inside the graph.

One graph per token bucket holds the drafter (it writes the query starts, lengths and slots
on the device from a counter it advances itself, so every replay verifies a different
number of tokens per request), the staging, both builders' mixed builds and the gather
consumer. The host hands over only the request count and the token bound (``k * next_n``).
After every replay the drafter's lengths are read back and

* the consumer's output over the real tokens equals the eager build fed the same lengths,
  bit for bit, and the step-alone oracle's checksums;
* the rows past the real tokens hold the consumer's padded value (0).

Per config, 1,000 replays of device-decided lengths, next_n 2 and 8.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.gather_world import gather_world
from helpers.mixed_steps import CONFIGS
from helpers.support import HostStep, quiet

from staticattn.checks import same_outputs, snapshot_outputs
from staticattn.graphs import (
    DeviceLengthSteps,
    EagerBuild,
    EagerReason,
    GraphKind,
    GraphManager,
)
from staticattn.reference import checksums

pytestmark = pytest.mark.gpu

REPLAYS = 1000
NUM_KV_BLOCKS = 100_000


class Drafter:
    """Request ``b`` verifies ``1 + h(counter, b) % next_n`` tokens after its context; the
    slots follow the SWA block table (slots address the SWA group, which the pool
    bounds). The counter lives on the device and the graph advances
    it, so no host value reaches the lengths."""

    def __init__(self, cfg, contexts: torch.Tensor) -> None:
        self.n, self.max_pos = cfg.next_n, cfg.max_model_len - 1
        self.block_size = cfg.swa_block_size
        self.contexts = contexts  # int64 (max_num_seqs,), device, owned by the test
        self.counter = torch.zeros(1, dtype=torch.int64, device="cuda")

    def __call__(self, inputs, num_reqs: int, num_tokens: int) -> None:
        b = torch.arange(num_reqs, device="cuda")
        h = (self.counter * 1_103_515_245 + b * 2_654_435_761 + 12_345) % 2_147_483_647
        q = 1 + (h >> 7) % self.n
        self.counter.add_(1)
        inputs.query_start_loc[:1].zero_()
        inputs.query_start_loc[1 : num_reqs + 1].copy_(torch.cumsum(q, 0))
        inputs.seq_lens[:num_reqs].copy_(self.contexts[:num_reqs] + q)
        t = torch.arange(num_tokens, device="cuda")
        ends = inputs.query_start_loc[1 : num_reqs + 1].long()
        req = torch.searchsorted(ends, t, right=True).clamp(max=num_reqs - 1)
        # Tokens past the real ones get clamped positions: the block-table read stays in
        # bounds, and the staging overwrites their slots with -1 anyway.
        pos = (self.contexts[req] + t - (ends[req] - q[req])).clamp(0, self.max_pos)
        block = inputs.swa_block_table[req, pos // self.block_size].long()
        inputs.slot_mapping[:num_tokens].copy_(block * self.block_size + pos % self.block_size)


@pytest.mark.parametrize("name", ["v4-n2", "v4-n8-flatten"])
def test_drafter_decided_lengths_replay_equal_to_eager(name):
    cfg = CONFIGS[name](device="cuda")
    arena, inputs, builders, consumer, caches = gather_world(cfg, NUM_KV_BLOCKS)
    rng = np.random.default_rng(7)
    tables = [rng.integers(0, NUM_KV_BLOCKS, size=v.shape, dtype=np.int32)
              for v in (inputs.block_table, inputs.swa_block_table)]
    inputs.block_table.copy_(torch.from_numpy(tables[0]))
    inputs.swa_block_table.copy_(torch.from_numpy(tables[1]))
    contexts = torch.zeros(cfg.max_num_seqs, dtype=torch.int64, device="cuda")
    drafter = Drafter(cfg, contexts)
    n = cfg.next_n
    with GraphManager(arena, inputs, builders, consumer, quiet()) as gm:
        steps = DeviceLengthSteps(gm, drafter)
        steps.capture([n * k for k in (1, 2, 4, 8, 16) if n * k <= cfg.max_num_batched_tokens])
        fingerprint = arena.fingerprint()
        seen_lengths = set()
        for i in range(REPLAYS):
            if i % 50 == 0:
                torch.cuda.synchronize()
                contexts.copy_(torch.from_numpy(
                    rng.integers(0, cfg.max_model_len - n, cfg.max_num_seqs)))
            k = int(rng.integers(1, min(16, cfg.max_num_seqs) + 1))
            bound = k * n
            out = steps.launch(k, bound)
            g = steps.graph_for(k, bound)
            replayed = snapshot_outputs(out)
            q, s, slots = steps.read_step(k)
            nt = int(q.sum())
            seen_lengths.update(q.tolist())
            assert replayed[0][nt:].abs().sum().item() == 0
            eager = snapshot_outputs(gm.run(q, s, slots, eager=EagerBuild.REFERENCE).outputs)
            assert same_outputs([r[:nt] for r in replayed], eager), i
            step = HostStep(q.astype(np.int32), s.astype(np.int32), slots,
                            tables[0][:k], tables[1][:k], k, nt)
            assert replayed[0][:nt].tolist() == checksums.expected(cfg, step, *caches, nt), i
            assert g is not None
        stats = gm.stats  # the eager steps are the A/B runs' own, forced
        assert stats.replays[GraphKind.DEVICE_LENGTHS] == REPLAYS
        assert set(stats.eager) == {EagerReason.FORCED}
        assert seen_lengths == set(range(1, n + 1))
        assert arena.fingerprint() == fingerprint
        print(f"\n{name}: {REPLAYS} replays of device-decided lengths\n" + gm.describe())
