"""DeepSeek V4.1 under decode context parallelism: every rank's builders against the per-rank
oracle (``staticattn/reference/v41_dcp.py``), both kernel backends.

Each example is one random V4.1 step (decodes, extends, fresh prefills, slot -1 tokens,
bounded-replay starts, graph padding) staged on every rank's arena -- the same global
inputs, each rank its own random tables of every cache group -- and built by the default
builders (``indexer.c1a``, ``indexer.c2a``, ``compressed``, ``swa``) eagerly, by the
graph-safe decode build and by the mixed build for a token bucket. Each rank's indexers and
compressed metadata equal the oracle over their whole views; the decode operand, derived
from random merged top-k rows, equals the oracle's share; and across the ranks every
completed entry is written by exactly one rank, the ranks' decode operands partition the
single-GPU one, and the SWA metadata (replicated) is the same everywhere.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from helpers.mixed_steps import bucket_for
from helpers.support import DEVICE
from helpers.v41_steps import (
    SMALL,
    group_tables,
    random_topk,
    stage_mixed_v41,
    stage_v41,
    v41_steps,
)
from hypothesis import given, settings

from staticattn.arena import ArenaConfig
from staticattn.builders import Batch, default_builders, make_arena
from staticattn.builders.indexer.prefill import max_chunks
from staticattn.reference import dcp_indexer, short_topk
from staticattn.reference import mixed as mixed_oracle
from staticattn.reference import swa as swa_oracle
from staticattn.reference import v41_compressed as single
from staticattn.reference import v41_dcp as oracle

INDEX_TYPES = ("c1a", "c2a")
# (world, interleave, block size, draft tokens, flatten)
GRID = [(2, 2, 64, 1, False), (2, 16, 64, 0, False), (4, 4, 128, 3, True)]
GRID_IDS = [f"W{w}-I{i}-bs{bs}-n{n + 1}{'-flat' if f else ''}" for w, i, bs, n, f in GRID]


def _examples(backend: str) -> int:
    return 8 if backend == "torch" else 3


def _ranks(backend, world, interleave, block_size, spec, flatten):
    """Per rank ``(config, builders by name, arena, inputs)``."""
    out = []
    for rank in range(world):
        cfg = ArenaConfig.preset(
            "deepseek-v4.1-flash", **SMALL, block_size=block_size,
            num_speculative_tokens=spec, use_flattening=flatten, dcp_world_size=world,
            dcp_rank=rank, cp_kv_cache_interleave_size=interleave, device=DEVICE,
            kernel_backend=backend)
        builders = {b.name: b for b in default_builders(cfg)}
        arena, inputs = make_arena(cfg, list(builders.values()))
        out.append((cfg, builders, arena, inputs))
    return out


def _per_rank(ranks, v41):
    """The step with each rank's own random tables (rank 0 keeps the drawn ones)."""
    rng = np.random.default_rng(v41.step.num_tokens)
    return [v41] + [dataclasses.replace(v41, tables=group_tables(cfg, v41.step.num_reqs, rng))
                    for cfg, *_ in ranks[1:]]


def _decode_rows(step, td: int):
    rows = td
    owner, position, own = single.tokens(step)
    own = own + [-1] * (rows - len(own))
    valid = [t < td and own[t] >= 0 for t in range(rows)]
    return owner + [0] * (rows - len(owner)), position, valid


def check_compressed(cfg, rank, meta, v41, num_reqs, num_tokens, td, seed):
    """One rank's compressed metadata and decode operands against the oracle; returns the
    operands' lengths per type (for the cross-rank check)."""
    want = oracle.compressed(cfg, v41, rank, num_reqs, num_tokens)
    for name, fields in want.items():
        for field, values in fields.items():
            assert getattr(meta.types[name], field).tolist() == values, (rank, name, field)
    rows = meta.num_decode_tokens
    owner, position, valid = _decode_rows(v41.step, td)
    owner, valid = owner + [0] * (rows - len(owner)), valid + [False] * (rows - len(valid))
    lens = {}
    for name in INDEX_TYPES:
        ratio, k = single.RATIOS[name], cfg.index_topk
        topk = random_topk(cfg, v41, ratio, rows, td, seed)
        rows_in = torch.tensor(topk, dtype=torch.int32, device=DEVICE).reshape(rows, k)
        table = v41.rows(f"{name}.compressed_kv", num_reqs)
        indices, got_lens = meta.decode_topk(name, rows_in)
        want_rows, want_lens = oracle.global_topk(cfg, name, rank, topk, owner, valid, table)
        assert indices[:, 0].tolist() == want_rows, (rank, name)
        assert got_lens.tolist() == want_lens, (rank, name)
        lens[name] = want_lens
        # The short-context fill decides on the global n_c(p), then the rank's share.
        filled = [short_topk.topk_row(position[t], ratio, k, topk[t]) if valid[t] else topk[t]
                  for t in range(rows)]
        indices, got_lens = meta.decode_topk(name, rows_in, short_context_fill=True)
        want_rows, want_lens = oracle.global_topk(cfg, name, rank, filled, owner, valid, table)
        assert indices[:, 0].tolist() == want_rows, (rank, name, "fill")
        assert got_lens.tolist() == want_lens, (rank, name, "fill")
    return lens


def check_across_ranks(metas, lens, v41, cfg, num_tokens, td, seed):
    """Each completed entry written once over the ranks; the ranks' operand lengths add up
    to the single-GPU ones."""
    owner, position, _ = single.tokens(v41.step)
    own = single.group_own_slots(v41, cfg.sliding_window)
    for name in INDEX_TYPES:
        ratio = single.RATIOS[name]
        written = np.sum([np.asarray(m.types[name].slot_mapping.tolist()) >= 0 for m in metas],
                         axis=0).tolist()
        completes = [int((p + 1) % ratio == 0 and own[t] != -1) for t, p in enumerate(position)]
        assert written == completes + [0] * (num_tokens - len(position)), name
        rows = metas[0].num_decode_tokens
        dec_owner, _, valid = _decode_rows(v41.step, td)
        valid = valid + [False] * (rows - len(valid))
        topk = random_topk(cfg, v41, ratio, rows, td, seed)
        whole = [sum(1 for k in row if k >= 0) if valid[t] else 0 for t, row in enumerate(topk)]
        assert np.sum([r[name] for r in lens], axis=0).tolist() == whole, name


def _indexers_match(cfg, rank, builders, batch, v41, arena, graph=False):
    for t in INDEX_TYPES:
        _, view_step = single.type_view(cfg, v41, t)
        meta = (builders[f"indexer.{t}"].build_decode(batch) if graph
                else builders[f"indexer.{t}"].build(batch))
        dcp_indexer.assert_matches(meta, oracle.indexer_metadata(cfg, v41, t, rank, graph=graph),
                                   view_step, arena)


def _fuzz(backend, params, body, **strategy) -> None:
    """Run ``body(ranks, v41, per_rank)`` over random steps of ``v41_steps(**strategy)`` on
    every rank of the grid point ``params``."""
    ranks = _ranks(backend, *params)

    @settings(max_examples=_examples(backend))
    @given(v41_steps(ranks[0][0], **strategy))
    def check(v41):
        body(ranks, v41, _per_rank(ranks, v41))

    check()


@pytest.mark.parametrize("params", GRID, ids=GRID_IDS)
def test_eager_builds_match_the_oracle_on_every_rank(backend, params):
    def body(ranks, v41, per_rank):
        step = v41.step
        r, nt = step.num_reqs_padded, step.num_tokens_padded
        qsl = step.query_start_loc
        td = swa_oracle.split([qsl[i + 1] - qsl[i] for i in range(r)], nt,
                              ranks[0][0].decode_threshold)[2]
        metas, lens, swa = [], [], []
        for rank, ((cfg, b, arena, inputs), mine) in enumerate(zip(ranks, per_rank)):
            batch = stage_v41(inputs, mine)
            _indexers_match(cfg, rank, b, batch, mine, arena)
            meta = b["compressed"].build(batch)
            lens.append(check_compressed(cfg, rank, meta, mine, r, nt, td, step.num_tokens))
            metas.append(meta)
            swa_meta = b["swa"].build(batch)
            swa.append((swa_meta.decode_swa_indices.tolist(), swa_meta.decode_swa_lens.tolist()))
        check_across_ranks(metas, lens, v41, ranks[0][0], nt, td, step.num_tokens)
        assert all(s == swa[0] for s in swa)

    _fuzz(backend, params, body, max_seq_len=4096)


@pytest.mark.parametrize("params", GRID, ids=GRID_IDS)
def test_decode_graph_builds_match_the_oracle_on_every_rank(backend, params):
    def body(ranks, v41, per_rank):
        step = v41.step
        r, nt = step.num_reqs_padded, step.num_tokens_padded
        metas, lens = [], []
        for rank, ((cfg, b, arena, inputs), mine) in enumerate(zip(ranks, per_rank)):
            stage_v41(inputs, mine)
            batch = Batch.for_decode_capture(inputs, r)
            _indexers_match(cfg, rank, b, batch, mine, arena, graph=True)
            meta = b["compressed"].build_decode(batch)
            lens.append(check_compressed(cfg, rank, meta, mine, r, nt, nt, step.num_tokens))
            metas.append(meta)
        check_across_ranks(metas, lens, v41, ranks[0][0], nt, nt, step.num_tokens)

    _fuzz(backend, params, body, kinds=("uniform_decode",))


@pytest.mark.parametrize("params", GRID, ids=GRID_IDS)
def test_mixed_builds_match_the_oracle_on_every_rank(backend, params):
    def body(ranks, v41, per_rank):
        step = v41.step
        cfg0 = ranks[0][0]
        num_reqs, num_tokens = bucket_for(cfg0, step.num_tokens,
                                          np.random.default_rng(step.num_tokens))
        td = mixed_oracle.counts(cfg0, step)[3]
        metas, lens = [], []
        for rank, ((cfg, b, _, inputs), mine) in enumerate(zip(ranks, per_rank)):
            batch = stage_mixed_v41(inputs, mine, num_reqs, num_tokens)
            for t in INDEX_TYPES:
                rows = max_chunks(cfg, num_reqs, num_tokens, single.RATIOS[t])
                want = oracle.mixed_indexer(cfg, mine, t, rank, num_reqs, num_tokens, rows)
                view, view_step = single.type_view(cfg, mine, t)
                dcp_indexer.assert_mixed_matches(b[f"indexer.{t}"].build_mixed(batch), want,
                                                 view, view_step)
            meta = b["compressed"].build_mixed(batch)
            lens.append(check_compressed(cfg, rank, meta, mine, num_reqs, num_tokens, td,
                                         step.num_tokens))
            metas.append(meta)
        check_across_ranks(metas, lens, v41, cfg0, num_tokens, td, step.num_tokens)

    _fuzz(backend, params, body, max_seq_len=4096)
