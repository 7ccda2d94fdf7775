"""On the GPU: the step contract holds a replay in flight. While step A is held back on the
replay stream, a second ``launch()`` of A's views (no ``begin_step()``) is refused and A
still computes A; ``begin_step()`` waits for A's staging to be read, so B written then
computes B, and A's metadata never sees B's values."""

from __future__ import annotations

import pytest
import torch
from helpers.staging_graph import S, staged_sums
from helpers.support import quiet

from staticattn.arena import ArenaConfig
from staticattn.builders import IndexerMetadataBuilder, SparseSWAMetadataBuilder, make_arena
from staticattn.errors import GraphError
from staticattn.graphs import GraphManager

pytestmark = pytest.mark.gpu


def test_a_replay_in_flight_is_never_rewritten_through_the_api():
    cfg = ArenaConfig.deepseek_v4(max_model_len=65536, max_num_seqs=64,
                                  max_num_batched_tokens=512)
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    n, size = cfg.next_n, S * cfg.next_n

    def step(batch, metadata):  # each token's position plus its sequence's length
        t2r = inputs.token_to_req[:size].long()
        return inputs.positions[:size] + inputs.seq_lens[t2r]

    la, lb = [1000 + i for i in range(S)], [5000 + i for i in range(S)]
    with GraphManager(arena, inputs, builders, step, quiet()) as gm:
        gm.capture([size], buckets=())
        views = gm.begin_step()
        views.seq_lens[:S], views.slot_mapping[:size] = la, -1
        with torch.cuda.stream(gm.stream):
            torch.cuda._sleep(400_000_000)  # ~0.2 s: A's staging waits behind it
        held = torch.cuda.Event()
        held.record(gm.stream)
        out = gm.launch(S)
        with pytest.raises(GraphError, match=r"begin_step\(\)"):
            gm.launch(S)  # A's views again, while A is held back: refused
        refused_in_flight = not held.query()
        views = gm.begin_step()  # waits until A's staging kernel has read the staging
        assert held.query(), "begin_step returned before A's staging was read"
        views.seq_lens[:S] = lb
        torch.cuda.synchronize()
        assert out.tolist() == staged_sums([n] * S, la, n)
        out = gm.launch(S)
        torch.cuda.synchronize()
        assert out.tolist() == staged_sums([n] * S, lb, n)
        assert refused_in_flight, "the refused launch came after A had run (host starved)"
        assert gm.stats.replays_total == 2
