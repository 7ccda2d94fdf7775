"""The short-context top-k fill (``vllm-0.33-extras.md`` §4), decided per row on the device:
the oracle on the spec's worked examples (§4.1), the kernel on both backends against the
oracle, the fused fill of the compressed decode operand, and the regression for vLLM #52492
through the graph manager: steps over short contexts (every row filled), long ones (every
row scored) and both in turn, compared with the eager reference build and the oracle -- on
CPU through the eager paths, on the GPU through captured graphs (captured at minimal
lengths, replayed long and short) and the recorded launches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.dsa_reference import (
    decode_token_table,
    emulated_paged_mqa_logits,
    fill_indexer_cache,
    indexer_problems,
    new_indexer_inputs,
)
from helpers.support import DEVICE, quiet
from hypothesis import given, settings
from hypothesis import strategies as st

from staticattn.arena import ArenaConfig
from staticattn.bench.random_batches import random_uniform_decode
from staticattn.builders import make_arena
from staticattn.builders.indexer.builder import IndexerMetadataBuilder
from staticattn.consumers.real.indexer_topk import IndexerTopKStep
from staticattn.graphs import EagerBuild, GraphManager
from staticattn.kernels.compressed.topk_operand import global_topk_slots
from staticattn.kernels.indexer.short_topk_fill import fill_short_context_topk
from staticattn.reference import short_topk as oracle

BLOCKS = 64


def test_the_worked_examples_of_the_spec():
    """§4.1: the reference kernel's rows, and which of them staticattn fills."""
    rows = [oracle.fill_row(p, 4, 6) for p in (0, 3, 4, 9, 23, 30)]
    assert rows == [[-1] * 6, [0] + [-1] * 5, [0] + [-1] * 5, [0, 1] + [-1] * 4,
                    [0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5]]
    # 7 candidates at p = 30: the reference writes the first 6, staticattn keeps the score.
    assert [oracle.fits(p, 4, 6) for p in (23, 30)] == [True, False]
    assert oracle.topk_row(30, 4, 6, [6, 0, 5, 1, 4, 2]) == [6, 0, 5, 1, 4, 2]
    assert [oracle.fill_row(p, 128, 4) for p in (126, 127, 300, 700)] == [
        [-1] * 4, [0, -1, -1, -1], [0, 1, -1, -1], [0, 1, 2, 3]]


def _scored(rng, counts, width):
    """Per row a random scored-looking row: a permutation of some of its keys, -1 after."""
    rows = []
    for n in counts:
        chosen = rng.permutation(max(n, 1))[: min(n, width)].tolist() if n else []
        rows.append(chosen + [-1] * (width - len(chosen)))
    return rows


def test_the_spec_example_through_the_kernel(backend):
    positions = [0, 3, 4, 9, 23, 30]
    counts = [oracle.compressed_count(p, 4) for p in positions]
    scored = [[-1] * 6, [0] + [-1] * 5, [0] + [-1] * 5, [1, 0] + [-1] * 4,
              [5, 4, 3, 2, 1, 0], [6, 0, 5, 1, 4, 2]]
    topk = torch.tensor(scored, dtype=torch.int32, device=DEVICE)
    fill_short_context_topk(backend, topk,
                            torch.tensor(counts, dtype=torch.int32, device=DEVICE), num_rows=6)
    assert topk.tolist() == [oracle.topk_row(p, 4, 6, s) for p, s in zip(positions, scored)]


def test_the_fill_kernel_matches_the_oracle(backend):
    @settings(max_examples=30 if backend == "torch" else 10, deadline=None)
    @given(st.data())
    def check(data):
        ratio = data.draw(st.sampled_from([1, 4, 128]))
        width = data.draw(st.sampled_from([1, 4, 6, 16, 40]))
        num_rows = data.draw(st.integers(0, 12))
        positions = data.draw(st.lists(st.integers(0, 3 * width * ratio),
                                       min_size=num_rows + 2, max_size=num_rows + 2))
        rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
        counts = [oracle.compressed_count(p, ratio) for p in positions]
        scored = _scored(rng, counts, width)
        topk = torch.tensor(scored, dtype=torch.int32, device=DEVICE)
        fill_short_context_topk(backend, topk,
                                torch.tensor(counts, dtype=torch.int32, device=DEVICE),
                                num_rows=num_rows)
        want = [oracle.topk_row(p, ratio, width, s) for p, s in zip(positions, scored)]
        # Rows past num_rows are not touched.
        assert topk.tolist() == want[:num_rows] + scored[num_rows:]

    check()


def test_the_fused_fill_of_the_decode_operand(backend):
    """``global_topk_slots`` with entry counts: rows that fit read ``0..n-1`` whatever they
    hold (here all -1: an unscored row), the others their top-k; invalid tokens -1."""
    entries, width = 4, 6
    positions = [3, 9, 23, 30, 9]
    counts = [oracle.compressed_count(p, 4) for p in positions]
    own = [0, 6, 7, 8, -1]  # slot 0 is a slot like any other; -1 marks the invalid token
    token_to_req = [0, 1, 1, 0, 1]
    table = [[3, 1], [2, 4]]
    given_rows = [[-1] * 6, [-1] * 6, [-1] * 6, [6, 0, 5, 1, 4, 2], [-1] * 6]
    out = torch.full((5, width), 9, dtype=torch.int32, device=DEVICE)
    lens = torch.full((5,), 9, dtype=torch.int32, device=DEVICE)
    dev = dict(dtype=torch.int32, device=DEVICE)
    global_topk_slots(backend, torch.tensor(given_rows, **dev), torch.tensor(token_to_req, **dev),
                      torch.tensor(own, dtype=torch.int64, device=DEVICE),
                      torch.tensor(table, **dev), out, lens, num_rows=5,
                      entries_per_block=entries,
                      entry_counts=torch.tensor(counts, **dev))
    want, want_lens = [], []
    for t, p in enumerate(positions):
        row = oracle.topk_row(p, 4, width, given_rows[t]) if own[t] >= 0 else [-1] * width
        slots = [table[token_to_req[t]][k // entries] * entries + k % entries if k >= 0
                 else -1 for k in row]
        want.append(slots)
        want_lens.append(sum(k >= 0 for k in row))
    assert out.tolist() == want and lens.tolist() == want_lens
    assert want[1] == [8, 9, -1, -1, -1, -1]  # p 9, request 1: entries 0, 1 of block 2


# ---------------------------------------------------------------- the indexer step, vLLM #52492
def _v4(backend):
    return ArenaConfig.deepseek_v4(max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=16,
                                   device=DEVICE, kernel_backend=backend, index_topk=128)


def _world(backend):
    cfg = _v4(backend)
    builders = [IndexerMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    step = IndexerTopKStep(cfg, num_kv_blocks=BLOCKS, logits_fn=emulated_paged_mqa_logits)
    return cfg, builders, arena, inputs, step


def _check_rows(step, inputs, s, out: torch.Tensor, keys) -> tuple[int, int]:
    """Every real row against the oracle: a row that fits is exactly the fill, the others
    the scored top-k (checked against the reference logits). Returns (filled, scored)."""
    cfg = inputs.config
    r, k = cfg.index_compress_ratio, step.topk
    _, pos, _ = decode_token_table(s.query_lens, s.seq_lens, r)
    assert indexer_problems(step, inputs, s, out, keys) == []
    got = out[: len(pos)].tolist()
    filled = 0
    for t, p in enumerate(pos.tolist()):
        if oracle.fits(p, r, k):
            assert got[t] == oracle.fill_row(p, r, k), t
            filled += 1
        else:
            assert got[t] != oracle.fill_row(p, r, k), t  # #52492: a long row filled
    return filled, len(pos) - filled


def _steps(inputs, rng, kinds):
    """One random uniform decode step per kind: "short" (every row fits the top-k), "long"
    (none does), "both"."""
    out = []
    for kind in kinds:
        k = int(rng.integers(1, 5))
        bound = {"short": 500, "long": None, "both": 1200}[kind]
        s = random_uniform_decode(inputs, k, rng, num_kv_blocks=BLOCKS, max_seq_len=bound,
                                  short_fraction=0.0 if kind == "long" else 0.5,
                                  invalid_fraction=0.0)
        if kind == "long":
            s.seq_lens[:] = np.maximum(s.seq_lens, 1000)
        out.append(s)
    return out


def _run_all(gm, step, inputs, keys, steps, eager_each: bool):
    totals = np.zeros(2, dtype=int)
    for i, s in enumerate(steps):
        new_indexer_inputs(step, i)
        args = (s.query_lens, s.seq_lens, s.slot_mapping)
        got = gm.run(*args).outputs.clone()
        totals += _check_rows(step, inputs, s, got, keys)
        if eager_each:
            ref = gm.run(*args, eager=EagerBuild.REFERENCE).outputs
            assert got.tolist() == ref.tolist()
    return totals


ORDER = ["short", "long", "short", "both", "long", "short"]


@pytest.mark.parametrize("capturable", [False, True], ids=["emulated", "graph-safe-logits"])
def test_short_then_long_steps_through_the_eager_paths(backend, capturable):
    """CPU (and GPU without capture): the graph builds run eagerly at each step's extents,
    short, long and both in turn through the same buffers, equal the reference build."""
    cfg, builders, arena, inputs, step = _world(backend)
    keys = fill_indexer_cache(step)
    if capturable:
        step.logits_fn = _graph_safe_logits(keys)
    gm = GraphManager(arena, inputs, builders, step, quiet())
    steps = _steps(inputs, np.random.default_rng(7), ORDER)
    filled, scored = _run_all(gm, step, inputs, keys, steps, eager_each=True)
    assert filled > 0 and scored > 0


def test_without_the_fill_the_rows_are_scored(backend):
    """The mutant check of the tests above: the scored path alone is a set, not the fill's
    position order, on most short rows."""
    cfg, builders, arena, inputs, _ = _world(backend)
    step = IndexerTopKStep(cfg, num_kv_blocks=BLOCKS, logits_fn=emulated_paged_mqa_logits,
                           short_context_fill=False)
    keys = fill_indexer_cache(step)
    gm = GraphManager(arena, inputs, builders, step, quiet())
    (s,) = _steps(inputs, np.random.default_rng(3), ["short"])
    new_indexer_inputs(step, 0)
    with pytest.raises(AssertionError):
        _check_rows(step, inputs, s, gm.run(s.query_lens, s.seq_lens, s.slot_mapping).outputs,
                    keys)


def _graph_safe_logits(keys: torch.Tensor):
    """The emulated paged-MQA logits without a host read (capturable): every column scored
    through the block table, the caller masks past the lengths. ``keys`` float
    ``(blocks, 64, D)``, the dequantised cache."""
    flat = keys.reshape(-1, keys.shape[-1])
    page = keys.shape[1]

    def logits(q, kv_cache, weights, seq_lens, block_table, schedule, max_context_len):
        rows, width, heads, dim = q.shape
        j = torch.arange(max_context_len, device=q.device)
        table = block_table.repeat_interleave(width, dim=0)
        col = torch.div(j, page, rounding_mode="floor").clamp(max=table.shape[1] - 1)
        k = flat[table[:, col].long() * page + j % page]
        s = torch.einsum("ehd,ejd->ehj", q.reshape(rows * width, heads, dim).float(), k)
        return (s.relu() * weights[:, :, None]).sum(1)

    return logits


@pytest.mark.gpu
def test_graphs_captured_short_replay_long_and_short_rows():
    """vLLM #52492: the graphs are captured at minimal lengths (every row fits); replayed
    over long, short and mixed contexts in turn, each replay equals the eager step and the
    oracle -- and the recorded launches (a step beyond every graph) likewise."""
    cfg, builders, arena, inputs, step = _world("triton")
    keys = fill_indexer_cache(step)
    step.logits_fn = _graph_safe_logits(keys)
    gm = GraphManager(arena, inputs, builders, step, quiet())
    gm.capture([2, 4, 8], buckets=())
    steps = _steps(inputs, np.random.default_rng(11), ORDER * 2)
    filled, scored = _run_all(gm, step, inputs, keys, steps, eager_each=True)
    assert filled > 0 and scored > 0
    assert gm.stats.replays_total > 0
    # Beyond every graph: the recorded launches of the graph builds.
    gm2 = GraphManager(arena, inputs, builders, step, quiet())
    filled, scored = _run_all(gm2, step, inputs, keys, _steps(inputs, np.random.default_rng(5),
                                                              ORDER * 2), eager_each=False)
    assert filled > 0 and scored > 0
