"""The indexer's real consumer on the rows of prefill-context-parallel ranks (DeepSeek
V3.2, and V4.1's c1a indexer; ``prefill-context-parallel.md`` §3.4, §4.2: without DCP a
rank's prefill rows are ordinary chunked-prefill rows, each reading its request's prefix
from the replicated cache): each rank's metadata, built on the device from the staged global
batch as in its graph, through the decode and prefill top-k (DeepGEMM's kernels on CUDA,
their torch emulations on CPU), gives every token the top-k of the single-GPU step's oracle
(V3.2: and the single-GPU step's own rows). The ranks run in one process: the metadata need
no collective, and the cache holds every key of the step, as it does on every rank after the
gathered writes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from helpers.dsa_reference import (
    check_topk,
    decode_token_table,
    emulated_mqa_logits,
    emulated_paged_mqa_logits,
    fill_indexer_cache,
    new_indexer_inputs,
    ref_indexer_logits,
)
from helpers.pcp_views import rank_metadata
from helpers.support import stage

from staticattn.builders.pcp.rank_views import table_columns
from staticattn.consumers.real.caches import INDEXER_BLOCK
from staticattn.distributed.pcp_rank import PCPRank
from staticattn.distributed.pcp_world import PCPSizes, configs, random_pcp_step, step_slots
from staticattn.kernels.runtime.dsa_libs import DEEP_GEMM, import_error

SIZES = PCPSizes(max_num_seqs=4, max_num_tokens=96, max_model_len=512)
#: Top-k below most tokens' key counts, so that scoring decides.
TOPK = 64
HEADS = dict(num_heads=32, head_dim=32)

CUDA = [pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
        pytest.mark.skipif(bool(import_error(DEEP_GEMM)), reason=str(import_error(DEEP_GEMM)))]
#: (preset, the index type scored, device, speculative tokens): V4.1's c1a (R = 1, pages of
#: 64 entries, its own group's table) is the type DeepGEMM's sm90 logits serve on its block
#: size; V3.2 also with single-module MTP (decode rows of 1 or 2 tokens; V4.1's PCP takes
#: none).
CASES = [("deepseek-v3.2", None, "cpu", 0), ("deepseek-v3.2", None, "cpu", 1),
         pytest.param("deepseek-v3.2", None, "cuda", 0, marks=CUDA),
         pytest.param("deepseek-v3.2", None, "cuda", 1, marks=CUDA),
         ("deepseek-v4.1-flash", "c1a", "cpu", 0)]


def _step(cfg, blocks: int, emulated: bool, index_type: str | None):
    from staticattn.consumers.real.indexer_topk import IndexerTopKStep

    fns = (dict(logits_fn=emulated_paged_mqa_logits, mqa_logits_fn=emulated_mqa_logits)
           if emulated else {})
    step = IndexerTopKStep(cfg, index_type=index_type, num_kv_blocks=blocks, prefill=True,
                           topk=TOPK, **HEADS, **fns)
    return step, fill_indexer_cache(step)


def _single_step_rows(cfg, single, s, q, seq) -> torch.Tensor:
    """The single-GPU step's rows of the step (DeepSeek V3.2: one block table), eagerly."""
    from staticattn.builders import IndexerMetadataBuilder, make_arena
    from staticattn.reference.step import HostStep

    builders = [IndexerMetadataBuilder()]
    _, inputs = make_arena(cfg, builders)
    host = HostStep(q.astype(np.int32), seq.astype(np.int32), step_slots(s, cfg.block_size),
                    s["table"].numpy(), None, q.size, int(q.sum()))
    batch = stage(inputs, host)
    return single(batch, {b.name: b.build(batch) for b in builders}).clone()


@pytest.mark.parametrize("preset,index_type,device,speculative", CASES)
@pytest.mark.parametrize("world", [2, 4])
def test_every_rank_token_gets_the_single_gpu_topk(preset, index_type, device, speculative,
                                                   world):
    sizes = dataclasses.replace(SIZES, num_speculative_tokens=speculative)
    pcp, rank_cfg, single_cfg = configs(preset, world, device, sizes, eager=True)
    rank_cfg = dataclasses.replace(rank_cfg, index_topk=TOPK)
    single_cfg = dataclasses.replace(single_cfg, index_topk=TOPK)
    emulated = device == "cpu"
    width = max(table_columns(single_cfg).values())
    blocks = sizes.kv_blocks(width)
    ranks = [PCPRank(pcp, rank_cfg, sizes.num_tokens(world), sizes.max_num_tokens, None, p,
                     blocks) for p in range(world)]
    rank_steps = [_step(rank_cfg, blocks, emulated, index_type)[0] for _ in ranks]
    # The single-GPU step's queries and cache (the same keys as every rank's).
    single, keys = _step(single_cfg, blocks, emulated, index_type)
    rng = np.random.default_rng(world)
    prefill_rows = drafts = 0
    for i in range(6 if emulated else 20):
        s = random_pcp_step(rng, sizes, width)
        drafts += sum(n > 1 and not pre for n, pre in zip(s["query_lens"], s["is_prefilling"]))
        q = np.asarray(s["query_lens"])
        seq = np.asarray(s["num_computed"]) + q
        new_indexer_inputs(single, i)
        tok_req, _, tok_len = decode_token_table(q, seq, 1)
        t = tok_req.shape[0]
        # The index type's table: its first columns (every table gets the step's rows).
        table = s["table"][:, : single.max_context_len // INDEXER_BLOCK].to(single.q.device)
        ref = ref_indexer_logits(single.q[:t], single.weights[:t], keys, table, tok_req,
                                 tok_len, single.max_context_len)
        if index_type is None:
            want = _single_step_rows(single_cfg, single, s, q, seq)
            assert check_topk(want[:t], ref, tok_len) == []
        seen = torch.zeros(t, dtype=torch.int64)
        for p, (rank, step) in enumerate(zip(ranks, rank_steps)):
            rb, md, glob = rank_metadata(rank, p, s)
            n = glob.shape[0]
            step.q[:n].copy_(single.q[glob])
            step.weights[:n].copy_(single.weights[glob])
            got = step(rb, md)[:n].cpu()
            g = glob.cpu().numpy()
            problems = check_topk(got, ref[g], tok_len[g])
            assert problems == [], (p, s, problems)
            seen[g] += 1
            prefill_rows += int((tok_len[g] > TOPK).sum())
        assert (seen >= 1).all(), "a global token no rank computed"
    assert prefill_rows > 0, "no token had more keys than the top-k"
    assert drafts > 0 or not speculative, "no decode row of more than one token"
