"""Drivers of the sparse decode consumer's tests (``SparseDecodeStep``), shared by the CPU
tests (library emulations) and the GPU tests (the real libraries): caches filled with random
keys, fresh inputs per step, and every output checked against torch references built from
the host truth (lengths, positions, the engine's block-table rows of every cache group).
What each layer attends beside its window follows its type's row, as in the package: the
dense type every complete entry, a top-k type the entries of its indexer's top-k."""

from __future__ import annotations

import torch

from helpers.dsa_reference import (
    DIM,
    attention_problems,
    decode_token_table,
    dense_slots,
    dequant_model1_cache,
    fill_indexer_cache,
    gather_keys,
    host_table,
    indexer_problems,
    new_indexer_inputs,
    ref_sparse_decode,
    seeded_generator,
    swa_slots,
    topk_slots,
)
from staticattn.consumers.real.caches import write_model1_cache
from staticattn.model import Cache, Reads


def fill_caches(step, seed: int = 0) -> tuple[dict, dict]:
    """Random keys into every cache of the step, random sinks; returns the dequantised
    indexer keys by top-k type and the attention caches by name ("swa", then by type)."""
    keys = {n: fill_indexer_cache(s, seed + i) for i, (n, s) in enumerate(step.indexers.items())}
    g = seeded_generator(step.q, seed)
    deq = {}
    for name, cache in {"swa": step.swa_cache, **step.caches}.items():
        nb, page = cache.shape[:2]
        write_model1_cache(cache, torch.randn(nb, page, DIM, generator=g, device=cache.device))
        deq[name] = dequant_model1_cache(cache)
    step.attn_sink.copy_(torch.randn(step.attn_sink.shape, generator=g, device=step.q.device))
    return keys, deq


def new_inputs(step, seed: int) -> None:
    """Fresh indexer queries and weights per top-k type, fresh attention queries."""
    for i, s in enumerate(step.indexers.values()):
        new_indexer_inputs(s, seed + 100 * i)
    g = seeded_generator(step.q, seed)
    step.q.copy_(torch.randn(step.q.shape, generator=g, device=step.q.device).clamp(-1, 1))


def step_problems(step, inputs, s, out: dict, keys: dict, deq: dict) -> list[str]:
    """The top-k of every top-k type and every layer's attention of the real tokens of step
    ``s`` against the references; an empty list when all is right."""
    cfg = inputs.config
    k = s.query_lens.shape[0]
    t = int(s.query_lens.sum())
    valid = s.slot_mapping >= 0
    tok_req, pos, _ = decode_token_table(s.query_lens, s.seq_lens, 1)
    swa_rows = inputs.swa_block_table[:k].cpu().numpy()
    window = gather_keys(deq["swa"], swa_slots(tok_req, pos, valid, swa_rows,
                                                cfg.sliding_window, cfg.swa_block_size))
    problems = []
    scope = {}
    for name, part in step.parts.items():
        row = part.row
        if row.reads is Reads.NONE:
            scope[name] = window
            continue
        rows = host_table(inputs, row, Cache.COMPRESSED_KV)[:k].cpu().numpy()
        per_block = row.entries_per_block(cfg.block_size)
        if row.reads is Reads.ALL:
            slots = dense_slots(tok_req, pos, valid, rows, cfg.dense_width, row.compress_ratio,
                                per_block)
        else:
            topk = out[f"topk.{name}"]
            problems += [f"top-k {name}: {p}"
                         for p in indexer_problems(part.indexer, inputs, s, topk, keys[name])]
            slots = topk_slots(topk[:t].cpu().numpy(), tok_req, valid, rows, per_block)
        ck, cv = gather_keys(deq[name], slots)
        scope[name] = (torch.cat([window[0], ck], 1), torch.cat([window[1], cv], 1))
    for layer, layer_type in step.layers:
        ref = ref_sparse_decode(step.q[layer, :t, 0], *scope[layer_type], step.scale,
                                step.attn_sink[layer])
        for p in attention_problems(out["attn"][:t, layer].float(), ref):
            problems.append(f"layer {layer} ({layer_type}): {p}")
    return problems
