"""The sparse-MLA prefill consumer on the rows of prefill-context-parallel ranks (DeepSeek
V3.2, ``prefill-context-parallel.md`` §3.6, PCP only: a rank's prefill rows are ordinary
chunked-prefill rows reading their prefix from the replicated cache): each rank's metadata,
built on the device from the staged global batch as in its graph, gives every prefill token
of the rank the attention of the oracle and of the single-GPU step (FlashMLA's sparse prefill
emulated in torch). The ranks run in one process, as in ``test_pcp_indexer_ranks.py``."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from helpers.dsa_reference import attention_problems, decode_token_table
from helpers.pcp_views import rank_metadata
from helpers.sparse_mla_reference import (
    UNTOUCHED,
    draw_topk,
    emulated_sparse_fwd,
    oracle_attention,
    served_row_problems,
)
from helpers.support import stage

from staticattn.builders import IndexerMetadataBuilder, make_arena
from staticattn.builders.pcp.rank_views import table_columns
from staticattn.consumers.real.caches import alloc_ds_mla_cache, write_ds_mla_cache
from staticattn.consumers.real.sparse_mla_prefill import SparseMLAPrefill
from staticattn.distributed.pcp_rank import PCPRank
from staticattn.distributed.pcp_world import PCPSizes, configs, random_pcp_step, step_slots
from staticattn.reference.step import HostStep

SIZES = PCPSizes(max_num_seqs=4, max_num_tokens=96, max_model_len=512)
TOPK, HEADS, WORLD = 128, 64, 2


def _consumer(cfg, cache):
    q = torch.zeros(cfg.max_num_batched_tokens, HEADS, 576, dtype=torch.bfloat16)
    return SparseMLAPrefill(cfg, kv_cache=cache, q=q, topk=TOPK,
                            sparse_fwd_fn=emulated_sparse_fwd)


def _attend(consumer, idx_md, topk: torch.Tensor, rows: int) -> torch.Tensor:
    """bf16 ``(rows, H, 512)``: the consumer's output rows for the top-k rows ``topk`` of
    the first tokens (-1 past them), :data:`UNTOUCHED` where it writes none."""
    padded = torch.full((rows, TOPK), -1, dtype=torch.int32)
    padded[: topk.shape[0]] = topk[:rows]
    out = torch.full((rows, HEADS, 512), UNTOUCHED, dtype=torch.bfloat16)
    consumer.attend_into(idx_md, padded, out)
    return out


def test_every_rank_prefill_token_gets_the_single_gpu_attention():
    pcp, rank_cfg, single_cfg = configs("deepseek-v3.2", WORLD, "cpu", SIZES, eager=True)
    # A workspace of about a request: chunks as small as the consumer takes.
    rank_cfg = dataclasses.replace(rank_cfg, index_topk=TOPK, max_prefill_workspace=600)
    single_cfg = dataclasses.replace(single_cfg, index_topk=TOPK, max_prefill_workspace=600)
    width = max(table_columns(single_cfg).values())
    blocks = SIZES.kv_blocks(width)
    cache = alloc_ds_mla_cache(blocks, "cpu")
    write_ds_mla_cache(cache, torch.randn(blocks, 64, 576, generator=torch.Generator()
                                          .manual_seed(0)))
    ranks = [PCPRank(pcp, rank_cfg, SIZES.num_tokens(WORLD), SIZES.max_num_tokens, None, p,
                     blocks) for p in range(WORLD)]
    rank_consumers = [_consumer(rank_cfg, cache) for _ in ranks]
    single = _consumer(single_cfg, cache)
    builders = [IndexerMetadataBuilder()]
    _, inputs = make_arena(single_cfg, builders)
    rng = np.random.default_rng(WORLD)
    compared = 0
    for _ in range(4):
        s = random_pcp_step(rng, SIZES, width)
        q = np.asarray(s["query_lens"])
        seq = np.asarray(s["num_computed"]) + q
        tok_req = decode_token_table(q, seq, 1)[0]
        t = tok_req.shape[0]
        single.q[:t].copy_(torch.randn(t, HEADS, 576).to(torch.bfloat16))
        topk = torch.from_numpy(draw_topk(rng, q, seq, TOPK, single_cfg.max_num_batched_tokens))
        table = s["table"].numpy()
        ref = oracle_attention(single.q, cache, table, q, seq, topk.numpy(), single.scale)
        host = HostStep(q.astype(np.int32), seq.astype(np.int32),
                        step_slots(s, single_cfg.block_size), table, None, q.size, t)
        batch = stage(inputs, host)
        idx_md = builders[0].build(batch)
        want = _attend(single, idx_md, topk, t)
        ts = idx_md.num_decode_tokens
        assert attention_problems(want[ts:], ref[ts:]) == []
        prefilling = np.asarray(s["is_prefilling"])[tok_req]
        for p, (rank, consumer) in enumerate(zip(ranks, rank_consumers)):
            rb, md, glob = rank_metadata(rank, p, s)
            n = glob.shape[0]
            consumer.q[:n].copy_(single.q[glob])
            got = _attend(consumer, md["indexer"], topk[glob], rb.num_actual_tokens)[:n]
            pre = torch.from_numpy(prefilling[glob.numpy()])
            assert served_row_problems(got, ref[glob[pre]], pre) == [], p
            # Where the single-GPU step attends too (its prefills: more than one token).
            both = pre & (glob >= ts)
            assert attention_problems(got[both], want[glob[both]].float()) == [], p
            compared += int(both.sum())
    assert compared > 0
