"""On the GPU: randomized steps of every composition replayed through the captured graphs.

Per config, steps drawn by ``support.host_steps`` run through ``GraphManager.run`` until
1,000 of them replayed a token bucket (a uniform decode step replays a decode graph: it is
checked the same way but not counted). Every step replays. After each replay:

* the graph's metadata views equal the oracle over their whole extent (real and padded
  regions alike): ``oracle.mixed`` for a bucket, ``oracle.indexer/swa`` for a decode graph;
* the same build run eagerly on the same staged inputs gives the same views bit for bit;
* the gather consumer's output (read through every token's metadata) equals the reference
  eager build's, and the step-alone oracle's.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from helpers.gather_world import gather_world
from helpers.mixed_steps import CONFIGS
from helpers.support import _t, host_steps, quiet
from hypothesis import HealthCheck, assume, given, settings

from staticattn.builders import IndexerMetadataBuilder, SparseSWAMetadataBuilder, make_arena
from staticattn.builders.indexer.prefill import max_chunks
from staticattn.checks import same_outputs, snapshot_outputs
from staticattn.checks.view_addresses import tensors_in
from staticattn.consumers import GatherConsumer
from staticattn.graphs import GraphKind, GraphManager
from staticattn.reference import checksums
from staticattn.reference import indexer as indexer_oracle
from staticattn.reference import mixed as mixed_oracle
from staticattn.reference import swa as swa_oracle

pytestmark = pytest.mark.gpu

STEPS = 1000


def _snapshot(metadata) -> list[torch.Tensor]:
    return [t.clone() for _, t in tensors_in(metadata)]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_step_replays_and_equals_eager_and_the_oracle(name):
    cfg = CONFIGS[name](device="cuda")
    arena, inputs, builders, consumer, caches = gather_world(cfg)
    gm = GraphManager(arena, inputs, builders, consumer, quiet())
    gm.capture()
    fingerprint = arena.fingerprint()
    counts = {GraphKind.DECODE: 0, GraphKind.MIXED: 0}

    # Steps that replay a decode graph are checked, then marked invalid so that they do
    # not count: the run ends after STEPS bucket replays.
    @settings(max_examples=STEPS, suppress_health_check=[HealthCheck.filter_too_much])
    @given(host_steps(cfg, max_seq_len=cfg.max_model_len))
    def check(step):
        r = step.num_reqs
        inputs.block_table[:r].copy_(_t(step.block_table))
        if step.swa_block_table is not None:
            inputs.swa_block_table[:r].copy_(_t(step.swa_block_table))
        res = gm.run(step.query_lens, step.seq_lens, step.slot_mapping)
        assert res.mode == "graph", res.reason
        replayed = snapshot_outputs(res.outputs)
        g = gm.graph_for(res.graph_size, res.graph_kind)
        views = _snapshot(g.metadata)
        if g.kind is GraphKind.MIXED:
            exp = mixed_oracle.indexer(cfg, step, g.num_reqs, g.size,
                                       max_chunks(cfg, g.num_reqs, g.size))
            mixed_oracle.assert_indexer_matches(g.metadata["indexer"], exp, cfg, step)
            if cfg.has_swa:
                mixed_oracle.assert_swa_matches(
                    g.metadata["swa"], mixed_oracle.swa(cfg, step, g.num_reqs, g.size), cfg,
                    step)
        else:
            padded = dataclasses.replace(step, num_reqs_padded=g.num_reqs,
                                         num_tokens_padded=g.size)
            indexer_oracle.assert_matches(
                g.metadata["indexer"], indexer_oracle.indexer_metadata(cfg, padded, graph=True),
                padded, arena)
            if cfg.has_swa:
                swa_oracle.assert_matches(g.metadata["swa"],
                                          swa_oracle.expected_for_step(cfg, padded))
        # The same build, eagerly, on the same staging: the same views bit for bit.
        gm.capturer.body(g.kind, g.num_reqs, g.size)
        assert all(torch.equal(a, b) for a, b in zip(views, _snapshot(g.metadata)))
        want = checksums.expected(cfg, step, *caches, step.num_tokens)
        assert replayed[0].tolist() == want
        eager = snapshot_outputs(gm.run_eager(step.query_lens, step.seq_lens,
                                              step.slot_mapping))
        assert same_outputs(replayed, eager)
        counts[g.kind] += 1
        assume(g.kind is GraphKind.MIXED)

    check()
    assert arena.fingerprint() == fingerprint
    gm.close()
    print(f"{name}: {counts[GraphKind.DECODE]} decode and {counts[GraphKind.MIXED]} mixed "
          "replays")
    assert counts[GraphKind.MIXED] >= STEPS


def test_a_rejected_step_leaves_everything_usable():
    """A mixed step beyond capacity or with inconsistent arrays: the typed error comes before
    anything is written, and the next good step replays."""
    from staticattn.errors import CapacityError, InvalidBatchError

    cfg = CONFIGS["v4-n2"](device="cuda")
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    consumer = GatherConsumer(cfg, num_kv_blocks=100_000)
    with GraphManager(arena, inputs, builders, consumer, quiet()) as gm:
        gm.capture()
        good = (np.array([2, 1, 40]), np.array([100, 50, 40]), np.arange(43))
        first = snapshot_outputs(gm.run(*good).outputs)
        before = {w: arena.block(w).clone() for w in ("device", "host")}
        bad = [
            ((np.array([2, 300]), np.array([9, 300]), np.arange(302)), CapacityError),
            ((np.array([2, 40]), np.array([9, 30]), np.arange(42)), InvalidBatchError),
            ((np.array([2, 40]), np.array([9, 90]), np.arange(41)), InvalidBatchError),
            ((np.array([40, 2]), np.array([90, 9]), np.arange(42)), InvalidBatchError),
        ]
        for args, error in bad:
            with pytest.raises(error):
                gm.run(*args)
            torch.cuda.synchronize()
            for w, block in before.items():
                assert torch.equal(arena.block(w), block), w
        res = gm.run(*good)
        assert res.mode == "graph" and same_outputs(snapshot_outputs(res.outputs), first)
