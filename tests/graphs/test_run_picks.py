"""What ``run`` picks for a step, seen from a step that reads the batch's ``max_seq_len`` (the
capture bound in a graph's or the graph builds' batch, the step's own longest sequence in
the reference builds'): the eager build of a step no graph holds (the run's ``eager``, else
the manager's ``eager_build``, else the graph builds), and the context bucket of a uniform
decode step on either path (the smallest holding its longest sequence). And the default
decode sizes of the smallest configs: 1, 2 and 4 as far as one step holds them, under MTP
rounded up to multiples of ``next_n`` (a larger step takes a token bucket)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.emulated_graphs import graphs_for
from helpers.support import DEVICE, quiet
from helpers.toy import ToyBuilder
from helpers.v41_swa_steps import EXAMPLE_V41

from staticattn.arena import ArenaConfig
from staticattn.builders import make_arena
from staticattn.graphs import ContextGraphs, EagerBuild, GraphManager
from staticattn.graphs.sizes import default_capture_sizes

V4 = ArenaConfig.deepseek_v4(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=256,
                             device=DEVICE)


class MaxSeqLen:
    """A step whose every output row is ``batch.max_seq_len``."""

    def __init__(self, config: ArenaConfig) -> None:
        self.out = torch.zeros(config.max_num_batched_tokens, dtype=torch.int64, device=DEVICE)

    def __call__(self, batch, md) -> torch.Tensor:
        return self.out.fill_(batch.max_seq_len)


BUILDS = [None, EagerBuild.GRAPH, EagerBuild.REFERENCE]


@pytest.mark.parametrize("option", BUILDS, ids=lambda b: f"manager-{b and b.value}")
@pytest.mark.parametrize("eager", BUILDS, ids=lambda b: f"run-{b and b.value}")
def test_the_eager_build_of_a_step_no_graph_holds(option, eager):
    b = ToyBuilder()
    arena, inputs = make_arena(V4, [b])
    gm = GraphManager(arena, inputs, [b], MaxSeqLen(V4),
                      quiet(**({} if option is None else {"eager_build": option})))
    res = gm.run([2, 8], [9, 40], np.arange(10), eager=eager)
    build = eager or option or EagerBuild.GRAPH  # the toy builder has both graph builds
    assert res.mode == "eager"
    assert res.outputs[:10].tolist() == [256 if build is EagerBuild.GRAPH else 40] * 10


@pytest.mark.parametrize("general", [False, True], ids=["fast path", "general path"])
@pytest.mark.parametrize(("seq_lens", "bucket"), [([40, 9], 64), ([9, 12], 16),
                                                  ([16, 3], 16), ([17, 64], 64)])
def test_a_uniform_decode_replays_the_bucket_of_its_longest_sequence(general, seq_lens,
                                                                     bucket):
    """``replay_start`` (all 0) sends the step down the general path."""
    cfg = ArenaConfig(**EXAMPLE_V41)
    b = ToyBuilder()
    arena, inputs = make_arena(cfg, [b])
    contexts = ContextGraphs(arena, inputs, [b], MaxSeqLen(cfg), contexts=[16, 64],
                             options=quiet())
    graphs_for(contexts)
    res = contexts.run([2, 2], seq_lens, np.arange(4),
                       replay_start=[0, 0] if general else None)
    assert res.mode == "graph"
    assert res.outputs[:4].tolist() == [bucket] * 4


@pytest.mark.parametrize(("max_num_seqs", "num_spec", "tokens", "sizes"), [
    (1, 0, 32, [1]), (2, 0, 32, [1, 2]), (4, 0, 32, [1, 2, 4]), (4, 0, 2, [1, 2]),
    (2, 1, 32, [2, 4]), (3, 1, 32, [2, 4]),
])
def test_default_decode_sizes_of_small_configs(max_num_seqs, num_spec, tokens, sizes):
    cfg = ArenaConfig.deepseek_v4(max_num_seqs=max_num_seqs, max_num_batched_tokens=tokens,
                                  max_model_len=256, num_speculative_tokens=num_spec,
                                  device=DEVICE)
    assert default_capture_sizes(cfg) == sizes
