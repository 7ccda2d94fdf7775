"""The graph manager on a DeepSeek-V4-like config with both builders and the gather
consumer: every default size and token bucket captured, 5,000 replays each equal to the
eager path bit for bit, mixed steps equal to the reference builds run alone, a fixed arena,
no allocation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.support import quiet

from staticattn.arena import ArenaConfig
from staticattn.bench.random_batches import DecodeStream, random_mixed_step
from staticattn.builders import (
    Batch,
    IndexerMetadataBuilder,
    SparseSWAMetadataBuilder,
    make_arena,
)
from staticattn.consumers.emulated.gather import GatherConsumer
from staticattn.graphs import GraphManager, default_capture_sizes

pytestmark = pytest.mark.gpu

REPLAYS = 5_000


@pytest.fixture(scope="module")
def v4():
    cfg = ArenaConfig.deepseek_v4(max_model_len=65536)
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    gm = GraphManager(arena, inputs, builders, GatherConsumer(cfg), quiet())
    gm.capture()
    print("\n" + gm.describe())
    yield cfg, arena, inputs, gm
    gm.close()


def test_every_default_size_captured(v4):
    cfg, _, _, gm = v4
    assert gm.capture_sizes == default_capture_sizes(cfg)
    for g in gm.graphs.values():
        if g.nodes is not None:
            assert g.nodes.get("kernel") == 5 and g.nodes.get("event_record") == 1, g.nodes


def test_replays_equal_eager_bit_for_bit(v4):
    cfg, arena, inputs, gm = v4
    rng = np.random.default_rng(0)
    stream = DecodeStream(inputs, rng)
    fingerprint = arena.fingerprint()
    sizes = gm.capture_sizes
    per_size = dict.fromkeys(sizes, 0)
    padded = mismatches = 0
    for i in range(REPLAYS):
        # Cycle through every size, exactly filled or padded, then random sizes.
        size = sizes[i % len(sizes)]
        k = size // cfg.next_n if i % 2 else int(rng.integers(1, size // cfg.next_n + 1))
        st = stream.next(k)
        res = gm.run(st.query_lens, st.seq_lens, st.slot_mapping)
        assert res.mode == "graph"
        per_size[res.graph_size] += 1
        padded += res.graph_size > k * cfg.next_n
        replayed = res.outputs.clone()
        eager = gm.run_eager(st.query_lens, st.seq_lens, st.slot_mapping)
        mismatches += int(not torch.equal(replayed, eager))
    print(f"{REPLAYS} replays ({padded} padded), every size {min(per_size.values())}+ times, "
          f"mismatches {mismatches}")
    assert mismatches == 0
    assert min(per_size.values()) > 0
    assert arena.fingerprint() == fingerprint


def test_replay_allocates_nothing(v4):
    cfg, _, inputs, gm = v4
    stream = DecodeStream(inputs, np.random.default_rng(1))
    steps = [stream.next(k) for k in (1, 7, 64, 200, 256)]
    for st in steps:
        gm.run(st.query_lens, st.seq_lens, st.slot_mapping)
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()
    for _ in range(200):
        for st in steps:
            gm.run(st.query_lens, st.seq_lens, st.slot_mapping)
    torch.cuda.synchronize()
    after = torch.cuda.memory_stats()
    assert after["allocation.all.allocated"] == before["allocation.all.allocated"]
    assert after["reserved_bytes.all.current"] == before["reserved_bytes.all.current"]


def test_mixed_steps_replay_and_equal_the_reference_builds_alone(v4):
    """Steps with prefills and decodes of unequal lengths replay a token bucket; each
    equals, token for token through the consumer, the reference builds run alone."""
    cfg, arena, inputs, gm = v4
    rng = np.random.default_rng(2)
    alone = GatherConsumer(cfg)
    for _ in range(200):
        st = random_mixed_step(inputs, rng, max_reqs=64)
        res = gm.run(st.query_lens, st.seq_lens, st.slot_mapping)
        assert res.mode == "graph", res.reason
        via_manager = res.outputs.clone()
        counts = inputs.stage(st.query_lens, st.seq_lens, st.slot_mapping)
        inputs.copy_to_device(counts.num_reqs, counts.num_tokens)
        batch = Batch.from_staged(inputs, counts)
        metadata = {b.name: b.build(batch) for b in gm.builders}
        assert torch.equal(via_manager, alone(batch, metadata)[: counts.num_tokens])
