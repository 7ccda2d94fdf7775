"""Drivers of the DeepSeek V4.1 decode consumer's tests, shared by the CPU test (library
emulations) and the GPU test (the real libraries): caches filled with random keys, fresh
inputs per step, and every output checked against torch references built from the host
truth (lengths, positions, the engine's block-table rows of every cache group)."""

from __future__ import annotations

import torch

from helpers.dsa_reference import (
    DIM,
    _gen,
    attention_problems,
    c4a_slots,
    check_topk,
    decode_token_table,
    dequant_model1_cache,
    fill_indexer_cache,
    gather_keys,
    new_indexer_inputs,
    ref_indexer_logits,
    ref_sparse_decode,
    swa_slots,
)
from staticattn.consumers.real.caches import write_model1_cache

RATIOS = {"c1a": 1, "c2a": 2}


def fill_v41_caches(step, seed: int = 0) -> tuple[dict, dict]:
    """Random keys into every cache of a ``V41DecodeStep``, random sinks; returns the
    dequantised indexer keys by index type and the attention caches by name ("swa",
    "c1a", "c2a")."""
    keys = {n: fill_indexer_cache(s, seed + i) for i, (n, s) in enumerate(step.indexers.items())}
    g = _gen(step.q, seed)
    deq = {}
    for name, cache in {"swa": step.swa_cache, **step.caches}.items():
        nb, page = cache.shape[:2]
        write_model1_cache(cache, torch.randn(nb, page, DIM, generator=g, device=cache.device))
        deq[name] = dequant_model1_cache(cache)
    step.attn_sink.copy_(torch.randn(step.attn_sink.shape, generator=g, device=step.q.device))
    return keys, deq


def new_v41_inputs(step, seed: int) -> None:
    """Fresh indexer queries and weights per type, fresh attention queries."""
    for i, s in enumerate(step.indexers.values()):
        new_indexer_inputs(s, seed + 100 * i)
    g = _gen(step.q, seed)
    step.q.copy_(torch.randn(step.q.shape, generator=g, device=step.q.device).clamp(-1, 1))


def v41_problems(step, inputs, s, out: dict, keys: dict, deq: dict) -> list[str]:
    """The top-k of every index type and every layer's attention of the real tokens of
    step ``s`` against the references."""
    cfg = inputs.config
    k = s.query_lens.shape[0]
    t = int(s.query_lens.sum())
    valid = s.slot_mapping >= 0
    tok_req, pos, _ = decode_token_table(s.query_lens, s.seq_lens, 1)
    swa_rows = inputs.swa_block_table[:k].cpu().numpy()
    sk, sv = gather_keys(deq["swa"], swa_slots(tok_req, pos, valid, swa_rows,
                                                cfg.sliding_window, cfg.swa_block_size))
    scope = {"swaonly": (sk, sv)}
    problems = []
    for name, indexer in step.indexers.items():
        ratio = RATIOS[name]
        _, _, tok_len = decode_token_table(s.query_lens, s.seq_lens, ratio)
        ref = ref_indexer_logits(indexer.q[:t], indexer.weights[:t], keys[name],
                                 inputs.block_tables[f"{name}.index_k"][:k], tok_req, tok_len,
                                 indexer.max_context_len)
        topk = out[f"topk.{name}"][:t]
        problems += [f"top-k {name}: {p}" for p in check_topk(topk, ref, tok_len)]
        rows = inputs.block_tables[f"{name}.compressed_kv"][:k].cpu().numpy()
        ck, cv = gather_keys(deq[name], c4a_slots(topk.cpu().numpy(), tok_req, valid, rows,
                                                   cfg.block_size // ratio))
        scope[name] = (torch.cat([sk, ck], 1), torch.cat([sv, cv], 1))
    for layer, layer_type in step.layers:
        ref = ref_sparse_decode(step.q[layer, :t, 0], *scope[layer_type], step.scale,
                                step.attn_sink[layer])
        for p in attention_problems(out["attn"][:t, layer].float(), ref):
            problems.append(f"layer {layer} ({layer_type}): {p}")
    return problems
