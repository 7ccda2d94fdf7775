"""The indexer's real consumer on prefill tokens (DeepGEMM's ``fp8_mqa_logits`` emulated in
torch): every token of a mixed step, decode and prefill, gets the top-k of the oracle's
logits (plain per-request scoring of the keys the token sees), whichever build made the
metadata -- the eager build's host-planned chunks, or a token bucket's device plan run at
fixed shapes -- including steps whose keys overflow one chunk; and on the rows of the ranks
of a prefill-context-parallel split (``prefill-context-parallel.md`` §3.4), token for token
what the single-GPU step gives."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from helpers.dsa_reference import (
    emulated_mqa_logits,
    emulated_paged_mqa_logits,
    fill_indexer_cache,
    indexer_problems,
    new_indexer_inputs,
)
from helpers.mixed_steps import bucket_for, stage_mixed
from helpers.support import host_steps, make_step, stage
from hypothesis import given, settings

from staticattn.arena import ArenaConfig
from staticattn.builders import IndexerMetadataBuilder, make_arena
from staticattn.consumers.real.indexer_topk import IndexerTopKStep

BLOCKS = 160
#: Small heads: the emulation scores in Python loops.
HEADS = dict(num_heads=32, head_dim=32)


def _config(**kw) -> ArenaConfig:
    base = dict(max_model_len=2048, max_num_seqs=8, max_num_batched_tokens=128,
                max_prefill_workspace=1500, max_logits_bytes=120_000, index_topk=64,
                device="cpu", kernel_backend="torch")
    return ArenaConfig.deepseek_v32(**{**base, **kw})


def _v4_config() -> ArenaConfig:
    """R = 4: a token at position p sees (p + 1) // 4 keys, 64 to a 256-token block."""
    return ArenaConfig.deepseek_v4(max_model_len=8192, max_num_seqs=8, max_num_batched_tokens=128,
                                   max_prefill_workspace=1500, max_logits_bytes=120_000,
                                   index_topk=64, num_speculative_tokens=0, device="cpu",
                                   kernel_backend="torch")


def _world(cfg: ArenaConfig, blocks: int = BLOCKS):
    builders = [IndexerMetadataBuilder()]
    _, inputs = make_arena(cfg, builders)
    step = IndexerTopKStep(cfg, num_kv_blocks=blocks, prefill=True, **HEADS,
                           logits_fn=emulated_paged_mqa_logits,
                           mqa_logits_fn=emulated_mqa_logits)
    return builders, inputs, step, fill_indexer_cache(step)


def _run(step, builders, batch, build: str) -> torch.Tensor:
    md = {b.name: getattr(b, build)(batch) for b in builders}
    return step(batch, md).clone()


@pytest.mark.parametrize("make_config", [_config, _v4_config], ids=["v3.2", "v4"])
def test_every_token_of_mixed_steps_gets_the_oracle_topk(make_config):
    cfg = make_config()
    builders, inputs, step, keys = _world(cfg)
    scored = []  # prefill tokens with more keys than the top-k, per step

    @settings(max_examples=12, deadline=None)
    @given(host_steps(cfg, kinds=("mixed",), max_seq_len=cfg.max_model_len))
    def check(s):
        new_indexer_inputs(step, s.num_tokens)
        s = dataclasses.replace(s, block_table=s.block_table % (BLOCKS - 1) + 1)
        eager = _run(step, builders, stage(inputs, s), "build")
        assert indexer_problems(step, inputs, s, eager, keys) == []
        num_reqs, num_tokens = bucket_for(cfg, s.num_tokens, np.random.default_rng(s.num_tokens))
        planned = _run(step, builders, stage_mixed(inputs, s, num_reqs, num_tokens),
                       "build_mixed")
        assert (planned[s.num_tokens:] == -1).all()
        assert indexer_problems(step, inputs, s, planned, keys) == []
        scored.append(sum(int(((np.arange(n - q, n) + 1) // step.compress_ratio > step.topk)
                              .sum()) for q, n in zip(s.query_lens, s.seq_lens) if q > 1))

    check()
    assert sum(scored) > 0, "no prefill token had more keys than the top-k"


#: Steps whose keys overflow the workspace: (query lengths, sequence lengths, the bucket's
#: requests). Two long prefills after a decode (the second's queries past the logits budget:
#: query sub-chunks); six short prefills, then a long one in a chunk of its own, cut into
#: query sub-chunks (the later range's requests must not see the earlier range's keys).
OVERFLOWS = {"two-long": ([1, 70, 50], [900, 1400, 1300], 4),
             "short-then-long": ([5] * 6 + [40], [100] * 6 + [1400], 8)}


@pytest.mark.parametrize("build", ["build", "build_mixed"])
@pytest.mark.parametrize("case", list(OVERFLOWS))
def test_keys_past_one_chunk_split_into_chunks_and_query_sub_chunks(build, case):
    """Every chunk's keys land where its tokens' key ranges point."""
    query_lens, seq_lens, bucket_reqs = OVERFLOWS[case]
    cfg = _config()
    builders, inputs, step, keys = _world(cfg)
    s = make_step(cfg, query_lens, seq_lens, rng=np.random.default_rng(1), num_blocks=BLOCKS)
    new_indexer_inputs(step, 5)
    batch = (stage(inputs, s) if build == "build"
             else stage_mixed(inputs, s, bucket_reqs, 128))
    md = builders[0].build(batch) if build == "build" else builders[0].build_mixed(batch)
    if build == "build":
        chunks = md.prefill.chunks
        assert len({c.req_start for c in chunks}) == 2 and len(chunks) > 2
    out = _run(step, builders, batch, build)
    assert indexer_problems(step, inputs, s, out, keys) == []


def test_without_prefill_the_prefill_rows_say_no_key():
    cfg = _config()
    builders, inputs, _, _ = _world(cfg)
    decode_only = IndexerTopKStep(cfg, num_kv_blocks=BLOCKS, **HEADS,
                                  logits_fn=emulated_paged_mqa_logits)
    assert decode_only.prefill_topk is None and decode_only.q.shape[0] == cfg.max_decode_tokens
    s = make_step(cfg, [1, 40], [300, 40], rng=np.random.default_rng(2), num_blocks=BLOCKS)
    out = _run(decode_only, builders, stage(inputs, s), "build")
    assert (out[1:41] == -1).all() and (out[0, :64] >= 0).all()
