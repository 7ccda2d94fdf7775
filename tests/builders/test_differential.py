"""Randomized differential testing.

One strategy of realistic steps (``support.host_steps``: decodes, MTP with variable accepted
lengths, extends, prefills, graph padding, long and short sequences, slot -1 tokens, random
block ids) drives every builder; each output is compared with the oracle. On CPU a bounded
number of examples runs through the eager builds (torch kernels and interpreted Triton); the
``gpu`` test runs many more on the device, through the eager path and, for uniform decode
steps, through graph replay of the GraphManager's captured builds.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers.support import DEVICE, _t, fuzz_examples, host_steps, quiet, stage
from hypothesis import given, settings

from staticattn.arena import ArenaConfig
from staticattn.builders import IndexerMetadataBuilder, SparseSWAMetadataBuilder, make_arena
from staticattn.graphs import GraphManager
from staticattn.reference import indexer as indexer_oracle
from staticattn.reference import swa as swa_oracle

CONFIGS = {
    "v4-mtp2": dict(num_speculative_tokens=1),
    "v4-mtp3-flatten": dict(num_speculative_tokens=2),
    "v4-plain": dict(num_speculative_tokens=0),
    "v4-mtp8-flatten": dict(num_speculative_tokens=7),
}


def _config(name: str, backend: str, device: str = DEVICE) -> ArenaConfig:
    return ArenaConfig.deepseek_v4(
        max_num_seqs=16, max_num_batched_tokens=256, max_model_len=4096, device=device,
        kernel_backend=backend, max_prefill_workspace=3000, max_logits_bytes=200_000,
        **CONFIGS[name],
    )


def _world(cfg):
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    return builders, arena, inputs


def _check_eager(cfg, builders, arena, inputs, step) -> None:
    batch = stage(inputs, step)
    idx, swa = (b.build(batch) for b in builders)
    indexer_oracle.assert_matches(idx, indexer_oracle.indexer_metadata(cfg, step), step, arena)
    swa_oracle.assert_matches(swa, swa_oracle.expected_for_step(cfg, step))


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("backend_name", ["torch", "triton"])
def test_eager_builds_match_the_oracle(name, backend_name):
    cfg = _config(name, backend_name)
    builders, arena, inputs = _world(cfg)

    # Interpreted Triton on CPU: 25 examples (about a quarter second each); compiled, 60.
    @settings(max_examples=150 if backend_name == "torch" else fuzz_examples(backend_name, 60, 25))
    @given(host_steps(cfg, max_seq_len=4096))
    def check(step):
        _check_eager(cfg, builders, arena, inputs, step)

    check()


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_many_steps_on_the_gpu_eager_and_replayed(name):
    """Every example eagerly; uniform decode examples also replayed through the graph the
    manager captured for their size, the captured metadata compared with the oracle of the
    step padded to that size."""
    cfg = _config(name, "triton", "cuda")
    builders, arena, inputs = _world(cfg)
    gm = GraphManager(arena, inputs, builders, lambda batch, md: None, quiet())
    n = cfg.next_n
    gm.capture([n * s for s in (1, 2, 4, 8, 16)])
    counts = {"eager": 0, "replayed": 0}

    @settings(max_examples=400)
    @given(host_steps(cfg, max_seq_len=4096))
    def check(step):
        _check_eager(cfg, builders, arena, inputs, step)
        counts["eager"] += 1
        if not (step.query_lens == n).all():
            return
        r = step.num_reqs
        inputs.block_table[:r].copy_(_t(step.block_table))
        inputs.swa_block_table[:r].copy_(_t(step.swa_block_table))
        res = gm.run(step.query_lens, step.seq_lens, step.slot_mapping)
        assert res.mode == "graph"
        g = gm.graphs[res.graph_size]
        padded = dataclasses.replace(step, num_reqs_padded=g.num_reqs,
                                     num_tokens_padded=g.size)
        torch.cuda.synchronize()
        indexer_oracle.assert_matches(
            g.metadata["indexer"], indexer_oracle.indexer_metadata(cfg, padded, graph=True),
            padded, arena)
        swa_oracle.assert_matches(g.metadata["swa"], swa_oracle.expected_for_step(cfg, padded))
        counts["replayed"] += 1

    check()
    gm.close()
    print(f"{name}: {counts['eager']} eager examples, {counts['replayed']} replayed")
    assert counts["replayed"] > 50
