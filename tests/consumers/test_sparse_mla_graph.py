"""DeepSeek V3.2's sparse-MLA consumers inside one CUDA graph: a token bucket's mixed
indexer build, FlashMLA's sparse prefill over the device plan and its sparse FP8 decode
(a tile-scheduler holder made inside the step, so the planner is recorded and re-plans at
every replay), captured once and replayed over drawn mixed steps -- every token's row
against the per-token oracle, and the same bytes as the same calls run eagerly."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from helpers.cuda_capture import capture
from helpers.dsa_reference import attention_problems
from helpers.mixed_steps import stage_mixed
from helpers.sparse_mla_reference import kernel_abs_tol, oracle_attention
from helpers.sparse_mla_steps import DEVICES, new_inputs, tiled_cache
from helpers.support import host_steps
from hypothesis import given, settings

from staticattn.arena import ArenaConfig
from staticattn.builders import IndexerMetadataBuilder, make_arena
from staticattn.builders.batch import Batch
from staticattn.consumers.real.sparse_mla_decode import SparseMLADecode
from staticattn.consumers.real.sparse_mla_prefill import SparseMLAPrefill

pytestmark = DEVICES[1].marks

BLOCKS = 64
HEADS = 64
TOPK = 128
#: The bucket every drawn step fits: the arena's requests and tokens.
REQS, TOKENS = 8, 128


@pytest.mark.parametrize("spec", [0, 1], ids=["next_n=1", "mtp-2"])
def test_prefill_and_decode_replay_in_one_mixed_graph(spec):
    cfg = ArenaConfig.deepseek_v32(
        max_model_len=1024, max_num_seqs=REQS, max_num_batched_tokens=TOKENS,
        max_prefill_workspace=1100, max_logits_bytes=120_000, index_topk=TOPK,
        num_speculative_tokens=spec, device="cuda")
    builder = IndexerMetadataBuilder()
    _, inputs = make_arena(cfg, [builder])
    cache = tiled_cache(BLOCKS, "cuda")
    q = torch.zeros(TOKENS, HEADS, 576, dtype=torch.bfloat16, device="cuda")
    prefill = SparseMLAPrefill(cfg, kv_cache=cache, q=q, topk=TOPK)
    decode = SparseMLADecode(cfg, kv_cache=cache, q=q, topk=TOPK)
    rows = torch.full((TOKENS, TOPK), -1, dtype=torch.int32, device="cuda")
    out = torch.zeros(TOKENS, HEADS, 512, dtype=torch.bfloat16, device="cuda")

    def step():
        md = builder.build_mixed(Batch.for_mixed_capture(inputs, REQS, TOKENS))
        prefill.attend_into(md, rows, out)
        decode.attend_into(md, rows, out)

    def place(s, seed: int) -> np.ndarray:
        """Stage ``s`` (block ids in the cache's pages) and its queries and top-k rows."""
        stage_mixed(inputs, s, REQS, TOKENS)
        topk = new_inputs(q, s, TOPK, seed)
        rows.fill_(-1)
        rows[: s.num_tokens] = torch.from_numpy(topk).cuda()
        return topk

    seen = {"steps": 0, "decode tokens": 0, "prefill tokens": 0}
    graph = None

    @settings(max_examples=12, deadline=None, derandomize=True)
    @given(host_steps(cfg, kinds=("mixed",), max_seq_len=cfg.max_model_len))
    def check(s):
        nonlocal graph
        s = dataclasses.replace(s, block_table=s.block_table % (BLOCKS - 1) + 1)
        topk = place(s, s.num_tokens)
        if graph is None:
            graph, _ = capture(step)
        graph.replay()
        torch.cuda.synchronize()
        got = out[: s.num_tokens].cpu()
        ref = oracle_attention(q.cpu(), cache.cpu(), s.block_table, s.query_lens, s.seq_lens,
                               topk, prefill.scale)
        tol = kernel_abs_tol(q.device, cache, s.block_table, s.query_lens, s.seq_lens, topk)
        assert attention_problems(got, ref, abs_tol=tol) == []
        step()
        torch.cuda.synchronize()
        assert torch.equal(out[: s.num_tokens].cpu(), got), "the replay and the eager calls differ"
        td = int(np.asarray(s.query_lens)[np.asarray(s.query_lens) <= cfg.next_n].sum())
        seen["steps"] += 1
        seen["decode tokens"] += td
        seen["prefill tokens"] += s.num_tokens - td

    check()
    assert all(seen.values()), seen
