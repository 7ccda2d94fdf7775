"""DeepSeek V4.1's builders against the oracle (``staticattn/reference/v41_compressed.py``), on the
V4.1-Flash shapes with small capacities and both kernel backends.

The default builder list -- ``indexer.c1a``, ``indexer.c2a``, ``compressed``, ``swa`` --
goes through ``make_arena``; randomized steps (uniform and variable MTP decodes, extends,
fresh prefills, slot -1 tokens, graph padding, null ring blocks) are built eagerly, by the
graph-safe decode build and by the mixed build for a token bucket, and every output the
indexers and the compressed builder own is compared with the oracle over its whole view,
padding included; the decode operand is derived from random top-k rows (garbage in the rows
of invalid tokens, which must come out -1).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.mixed_steps import bucket_for
from helpers.support import DEVICE
from helpers.v41_steps import (
    CONFIGS,
    random_topk,
    stage_mixed_v41,
    stage_v41,
    v41_config,
    v41_steps,
)
from hypothesis import given, settings

from staticattn.builders import Batch, default_builders, make_arena
from staticattn.builders.indexer.prefill import max_chunks
from staticattn.reference import indexer as indexer_oracle
from staticattn.reference import mixed as mixed_oracle
from staticattn.reference import short_topk
from staticattn.reference import swa as swa_oracle
from staticattn.reference import v41_compressed as oracle

INDEX_TYPES = ("c1a", "c2a")


def _world(name: str, backend: str):
    cfg = v41_config(name, backend)
    builders = {b.name: b for b in default_builders(cfg)}
    arena, inputs = make_arena(cfg, list(builders.values()))
    return cfg, builders, arena, inputs


def _examples(backend: str) -> int:
    return 25 if backend == "torch" else 8


def check_compressed(cfg, meta, v41, num_reqs: int, num_tokens: int, td: int, seed: int):
    want = oracle.compressed(cfg, v41, num_reqs, num_tokens)
    for name, fields in want.items():
        kv = meta.types[name]
        for field, values in fields.items():
            assert getattr(kv, field).tolist() == values, (name, field)
        if "ring_slot_mapping" not in fields:
            assert kv.ring_slot_mapping is None
    rows = meta.num_decode_tokens
    owner, position, own = oracle.tokens(v41.step)
    own = own + [-1] * (rows - len(own))
    valid = [t < td and own[t] >= 0 for t in range(rows)]
    owner = owner + [0] * (rows - len(owner))
    for name in INDEX_TYPES:
        topk = random_topk(cfg, v41, oracle.RATIOS[name], rows, td, seed)
        rows_in = torch.tensor(topk, dtype=torch.int32, device=DEVICE)
        indices, lens = meta.decode_topk(name, rows_in.reshape(rows, cfg.index_topk))
        table = v41.rows(f"{name}.compressed_kv", num_reqs)
        want_rows, want_lens = oracle.global_topk(topk, owner, valid, table,
                                                  cfg.block_size // oracle.RATIOS[name])
        assert indices.shape == (rows, 1, cfg.index_topk)
        assert indices[:, 0].tolist() == want_rows, name
        assert lens.tolist() == want_lens, name
        # The short-context fill, per row: rows whose n_c(p) fits K read every entry.
        ratio, k = oracle.RATIOS[name], cfg.index_topk
        filled = [short_topk.topk_row(position[t], ratio, k, topk[t]) if valid[t] else topk[t]
                  for t in range(rows)]
        indices, lens = meta.decode_topk(name, rows_in.reshape(rows, k),
                                         short_context_fill=True)
        want_rows, want_lens = oracle.global_topk(filled, owner, valid, table,
                                                  cfg.block_size // ratio)
        assert indices[:, 0].tolist() == want_rows, name
        assert lens.tolist() == want_lens, name


def _split_tokens(cfg, step) -> int:
    return mixed_oracle.counts(cfg, step)[3]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_eager_builds_match_the_oracle(backend, name):
    cfg, b, arena, inputs = _world(name, backend)

    @settings(max_examples=_examples(backend))
    @given(v41_steps(cfg, max_seq_len=4096))
    def check(v41):
        batch = stage_v41(inputs, v41)
        step = v41.step
        for t in INDEX_TYPES:
            _, view_step = oracle.type_view(cfg, v41, t)
            indexer_oracle.assert_matches(b[f"indexer.{t}"].build(batch),
                                          oracle.indexer_metadata(cfg, v41, t), view_step,
                                          arena)
        meta = b["compressed"].build(batch)
        # The decode rows are the attention's (the SWA builder's split, non-uniform).
        qsl = step.query_start_loc
        query_lens = [qsl[i + 1] - qsl[i] for i in range(step.num_reqs_padded)]
        td = swa_oracle.split(query_lens, step.num_tokens_padded, cfg.decode_threshold)[2]
        assert meta.num_decode_tokens == td
        check_compressed(cfg, meta, v41, step.num_reqs_padded, step.num_tokens_padded, td,
                         step.num_tokens)
        b["swa"].build(batch)

    check()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_decode_graph_builds_match_the_oracle_and_the_eager_build(backend, name):
    cfg, b, arena, inputs = _world(name, backend)

    @settings(max_examples=_examples(backend))
    @given(v41_steps(cfg, kinds=("uniform_decode",)))
    def check(v41):
        eager_batch = stage_v41(inputs, v41)
        step = v41.step
        eager = {n: x.build(eager_batch) for n, x in b.items()}
        batch = Batch.for_decode_capture(inputs, step.num_reqs_padded)
        graph = {n: x.build_decode(batch) for n, x in b.items()}
        for t in INDEX_TYPES:
            _, view_step = oracle.type_view(cfg, v41, t)
            indexer_oracle.assert_matches(graph[f"indexer.{t}"],
                                          oracle.indexer_metadata(cfg, v41, t, graph=True),
                                          view_step, arena)
            if not cfg.use_flattening:
                # Uniform decodes lay out alike eagerly and in the graph.
                assert (indexer_oracle.decode_values(graph[f"indexer.{t}"])
                        == indexer_oracle.decode_values(eager[f"indexer.{t}"]))
        r, nt = step.num_reqs_padded, step.num_tokens_padded
        check_compressed(cfg, graph["compressed"], v41, r, nt, nt, step.num_tokens)
        for kv_graph, kv_eager in zip(graph["compressed"].types.values(),
                                      eager["compressed"].types.values()):
            assert kv_graph.slot_mapping.tolist() == kv_eager.slot_mapping.tolist()
        swa_graph, swa_eager = graph["swa"], eager["swa"]
        assert swa_graph.decode_swa_indices.tolist() == swa_eager.decode_swa_indices.tolist()
        assert swa_graph.decode_swa_lens.tolist() == swa_eager.decode_swa_lens.tolist()
        assert {t for t, h in swa_graph.tile_scheds.items() if h is not None} == {
            "swaonly", "c1a", "c2a"}

    check()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_mixed_builds_match_the_oracle(backend, name):
    cfg, b, arena, inputs = _world(name, backend)

    @settings(max_examples=_examples(backend))
    @given(v41_steps(cfg, max_seq_len=4096))
    def check(v41):
        step = v41.step
        num_reqs, num_tokens = bucket_for(cfg, step.num_tokens,
                                          np.random.default_rng(step.num_tokens))
        batch = stage_mixed_v41(inputs, v41, num_reqs, num_tokens)
        for t in INDEX_TYPES:
            rows = max_chunks(cfg, num_reqs, num_tokens, oracle.RATIOS[t])
            want = oracle.mixed_indexer(cfg, v41, t, num_reqs, num_tokens, rows)
            _, view_step = oracle.type_view(cfg, v41, t)
            mixed_oracle.assert_indexer_matches(b[f"indexer.{t}"].build_mixed(batch), want,
                                                cfg, view_step)
        meta = b["compressed"].build_mixed(batch)
        assert meta.num_decode_tokens == min(num_tokens, cfg.max_decode_tokens)
        check_compressed(cfg, meta, v41, num_reqs, num_tokens, _split_tokens(cfg, step),
                         step.num_tokens)
        b["swa"].build_mixed(batch)

    check()
