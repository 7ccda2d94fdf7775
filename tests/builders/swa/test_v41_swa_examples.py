"""The worked examples, exactly, on both backends: ``docs/spec/deepseek-v41.md`` §11 (the SWA parts
of cases 1-4: prefill rows and gather lengths, chunk plans, decode rows, combined and FlashInfer
lengths, bounded replay) and ``vllm-0.33-extras.md`` §2.7 (A and A': paged prefill rows, gather
lengths, chunk plans with ``C = 2``).

Every example also goes through the oracle (``staticattn.reference.v41_swa``), and the eager
build of each is compared with the token-bucket build of the same step where the layouts agree.
"""

from __future__ import annotations

import pytest
import torch
from helpers.support import DEVICE
from helpers.v41_swa_steps import EXAMPLE_V41, example_step, oracle_step, stage_bucket, stage_eager

from staticattn.arena import ArenaConfig
from staticattn.builders import make_arena
from staticattn.builders.swa.builder import SparseSWAMetadataBuilder
from staticattn.reference import v41_swa as oracle


def _world(backend: str, chunk_size: int = 4, **overrides):
    cfg = ArenaConfig(**{**EXAMPLE_V41, **overrides, "kernel_backend": backend})
    builder = SparseSWAMetadataBuilder(prefill_chunk_size=chunk_size)
    _, inputs = make_arena(cfg, [builder])
    return cfg, builder, inputs


def _short_context_topk(meta, ratio: int, k: int) -> torch.Tensor:
    """The indexer's short-context fill (extras §4.1): row ``[0 .. n_c - 1, -1, ...]`` for
    every token, ``n_c = (p + 1) // R``; by token, as the reference's top-k buffer."""
    pos = meta.positions.long()
    n_c = (pos + 1) // ratio
    cols = torch.arange(k, device=pos.device)
    return torch.where(cols[None, :] < n_c[:, None], cols[None, :], -1).to(torch.int32)


def _plan_rows(meta) -> dict[str, list]:
    return {name: [tuple(r) for r in plan.chunks[: plan.num_chunks.item()].tolist()]
            for name, plan in meta.prefill_chunk_plans.items()}


def test_case1_fresh_prefills(backend):
    cfg, builder, inputs = _world(backend)
    step, rs = example_step(cfg, [5, 9], [5, 9], [[3, 4], [5, 6, 7]])
    meta = builder.build(stage_eager(inputs, step, rs))
    assert meta.prefill_swa_lens.tolist() == [1, 2, 3, 4, 4] + [1, 2, 3, 4, 4, 4, 4, 4, 4]
    assert meta.prefill_gather_lens.tolist() == [5, 9]
    want = {"swaonly": [(0, 2, 0, 9)], "c1a": [(0, 2, 9, 18)], "c2a": [(0, 2, 4, 13)]}
    assert {n: p.host for n, p in meta.prefill_chunk_plans.items()} == want
    assert _plan_rows(meta) == want
    rows, lens = builder.prefill_combined_rows(meta, "c2a", _short_context_topk(meta, 2, 4))
    assert lens.tolist() == [1, 3, 4, 6, 6] + [1, 3, 4, 6, 6, 7, 7, 8, 8]
    assert rows.shape == (14, 128)
    oracle.assert_eager(meta, oracle.expected_eager(cfg, oracle_step(step, rs, padded=True)))
    assert all(t is None for t in meta.tile_scheds.values())  # no decode tokens


def test_case2_decodes_padded_and_flashinfer_rows(backend):
    cfg, builder, inputs = _world(backend)
    step, rs = example_step(cfg, [1, 1], [6, 10], [[2, 7], [1, 5, 9]], num_reqs_padded=4,
                            num_tokens_padded=4)
    meta = builder.build(stage_eager(inputs, step, rs))
    assert (meta.num_decodes, meta.num_prefills, meta.num_decode_tokens,
            meta.num_prefill_tokens) == (4, 0, 4, 0)
    assert meta.decode_swa_indices[:, 0].tolist() == [[10, 11, 28, 29], [22, 23, 36, 37],
                                                      [-1] * 4, [-1] * 4]
    assert meta.decode_swa_lens.tolist() == [4, 4, 0, 0]
    assert meta.token_to_req_indices.tolist() == [0, 1, 0, 0]
    assert meta.is_valid_token.tolist() == [True, True, False, False]
    assert {n for n, s in meta.tile_scheds.items() if s is not None} == {"swaonly", "c1a",
                                                                        "c2a"}
    topk = torch.tensor([[5, 0, 3, -1], [9, 8, 2, 0], [-1] * 4, [-1] * 4], dtype=torch.int32,
                        device=DEVICE)
    c1a_table = torch.tensor([[3, 1], [5, 6], [0, 0], [0, 0]], dtype=torch.int32,
                             device=DEVICE)
    rows, lens = builder.flashinfer_rows(meta, "c1a", topk, compressed_block_table=c1a_table)
    assert rows.tolist() == [[10, 11, 28, 29, 29, 24, 27, -1],
                             [22, 23, 36, 37, 49, 48, 42, 40], [-1] * 8, [-1] * 8]
    assert lens.tolist() == [7, 8, 4, 4]
    c2a_topk = torch.tensor([[0, 1, 2, -1], [4, 3, 0, 1], [-1] * 4, [-1] * 4],
                            dtype=torch.int32, device=DEVICE)
    c2a_table = torch.tensor([[11, 1], [12, 13], [0, 0], [0, 0]], dtype=torch.int32,
                             device=DEVICE)
    rows, lens = builder.flashinfer_rows(meta, "c2a", c2a_topk, compressed_block_table=c2a_table)
    assert [r[4:] for r in rows.tolist()[:2]] == [[44, 45, 46, -1], [52, 51, 48, 49]]
    assert lens.tolist() == [7, 8, 4, 4]


def test_case3_mixed_with_a_verify_decode(backend):
    cfg, builder, inputs = _world(backend)
    step, rs = example_step(cfg, [2, 4, 5], [10, 11, 5], [[1, 7, 8], [1, 2, 3], [4, 5]])
    batch = stage_eager(inputs, step, rs)
    meta = builder.build(batch)
    assert (meta.num_decodes, meta.num_prefills, meta.num_decode_tokens,
            meta.num_prefill_tokens) == (1, 2, 2, 9)
    assert meta.decode_swa_indices[:, 0].tolist() == [[29, 30, 31, 32], [30, 31, 32, 33]]
    assert meta.prefill_gather_lens.tolist() == [7, 5]
    assert meta.prefill_chunk_plans["c2a"].host == [(0, 2, 5, 12)]
    rows, lens = builder.prefill_combined_rows(meta, "c2a", _short_context_topk(meta, 2, 4))
    assert rows.shape == (9, 128)
    assert lens.tolist() == [8, 8, 8, 8, 1, 3, 4, 6, 6]
    # The continuation's first token p = 7: top-k [0, 1, 2, 3] of its 5 entries, then the
    # window p = 4 .. 7, the first 4 gathered positions (gather_start 4) at N = 5.
    assert rows[0, :9].tolist() == [0, 1, 2, 3, 5, 6, 7, 8, -1]
    # The fresh prefill is the chunk's second request: rows M = 12 on.
    assert rows[8, :7].tolist() == [12, 13, 12 + 5 + 1, 12 + 5 + 2, 12 + 5 + 3, 12 + 5 + 4, -1]
    oracle.assert_eager(meta, oracle.expected_eager(cfg, oracle_step(step, rs, padded=True)))
    # The same step through a token bucket: the same rows at the top, -1 / 0 below.
    mixed = builder.build_mixed(stage_bucket(inputs, step, rs, 4, 16))
    m_rows, m_lens = builder.prefill_combined_rows(mixed, "c2a", _short_context_topk(mixed, 2, 4))
    assert m_lens.tolist() == lens.tolist() + [0] * 7
    assert m_rows[:9].tolist() == rows.tolist()
    assert (m_rows[9:] == -1).all()


def test_case4_bounded_replay(backend):
    """An 8-token prefix hit with W = 4 rewinds to replay_start 4: the request prefills
    positions 4 .. 11 and its windows stop at 4."""
    cfg, builder, inputs = _world(backend)
    step, rs = example_step(cfg, [8], [12], [[1, 2, 3]], replay_start=[4])
    meta = builder.build(stage_eager(inputs, step, rs))
    assert meta.replay_start.tolist() == [4]
    assert meta.prefill_swa_lens.tolist() == [1, 2, 3, 4, 4, 4, 4, 4]
    assert meta.prefill_swa_indices[0, 0].tolist() == [8, -1, -1, -1]  # p = 4 alone
    assert meta.prefill_gather_lens.tolist() == [8]
    topk = _short_context_topk(meta, 2, 4)
    _, lens = builder.prefill_combined_rows(meta, "c2a", topk)
    assert lens.tolist() == [3, 5, 6, 8, 8, 8, 8, 8]
    flash_rows, flash_lens = builder.flashinfer_rows(
        meta, "c2a", topk, compressed_block_table=torch.ones(1, 8, dtype=torch.int32,
                                                             device=DEVICE))
    assert flash_rows[0, :4].tolist() == [8, -1, -1, -1]  # the window from replay_start
    assert flash_lens.tolist() == [4 + min((p + 1) // 2, 4) for p in range(4, 12)]
    oracle.assert_eager(meta, oracle.expected_eager(cfg, oracle_step(step, rs, padded=True)))
    mixed = builder.build_mixed(stage_bucket(inputs, step, rs, 2, 16))
    assert mixed.prefill_swa_lens.tolist() == [1, 2, 3, 4, 4, 4, 4, 4] + [0] * 8
    assert mixed.prefill_gather_lens.tolist() == [8, 0]
    _, m_lens = builder.prefill_combined_rows(mixed, "c2a", _short_context_topk(mixed, 2, 4))
    assert m_lens.tolist() == [3, 5, 6, 8, 8, 8, 8, 8] + [0] * 8


EXAMPLE_A = dict(device=DEVICE, architecture="deepseek_v4", compress_ratios=(1, 4, 128),
                 block_size=256, sliding_window=4, swa_block_size=4, max_model_len=256,
                 max_num_seqs=4, max_num_batched_tokens=16, num_speculative_tokens=0)
A_ROWS = [[24, 25, 26, 27], [25, 26, 27, 36], [26, 27, 36, 37], [8, -1, -1, -1],
          [8, 9, -1, -1], [8, 9, 10, -1], [8, 9, 10, 11], [9, 10, 11, 28]]


@pytest.mark.parametrize("padded", [False, True], ids=["A", "A'"])
def test_example_a_paged_prefill_rows(backend, padded):
    cfg = ArenaConfig(**EXAMPLE_A, kernel_backend=backend)
    builder = SparseSWAMetadataBuilder(prefill_chunk_size=2)
    _, inputs = make_arena(cfg, [builder])
    step, rs = example_step(cfg, [1, 3, 5], [7, 10, 5], [[3, 8, 0], [5, 6, 9], [2, 7, 0]],
                            num_reqs_padded=4 if padded else None,
                            num_tokens_padded=12 if padded else None)
    meta = builder.build(stage_eager(inputs, step, rs))
    assert meta.replay_start is None  # V4: no bounded replay
    assert meta.decode_swa_indices[:, 0].tolist() == [[15, 32, 33, 34]]
    tail = [[-1] * 4] * 3 if padded else []
    assert meta.prefill_swa_indices[:, 0].tolist() == A_ROWS + tail
    assert meta.prefill_swa_lens.tolist() == [4, 4, 4, 1, 2, 3, 4, 4] + [0] * len(tail)
    assert meta.prefill_gather_lens.tolist() == [6, 5] + [0] * padded
    assert (meta.num_decodes, meta.num_prefills, meta.num_decode_tokens,
            meta.num_prefill_tokens) == ((1, 3, 1, 11) if padded else (1, 2, 1, 8))
    ends = 3 if padded else 2
    want = {"swaonly": [(0, ends, 0, 6)], "c4a": [(0, ends, 2, 8)],
            "c128a": [(0, ends, 0, 6)]}
    assert {n: p.host for n, p in meta.prefill_chunk_plans.items()} == want
    assert _plan_rows(meta) == want
    if padded:
        assert meta.token_to_req_indices.tolist() == [0, 1, 1, 1, 2, 2, 2, 2, 2, 0, 0, 0]
    oracle.assert_eager(meta, _with_chunk_size(
        oracle.expected_eager(cfg, oracle_step(step, rs, padded=True)), cfg, step, 2))


def _with_chunk_size(exp: dict, cfg, step, chunk_size: int) -> dict:
    """The oracle's plans for another ``C``."""
    o = oracle_step(step, [0] * step.num_reqs, padded=True)
    d = oracle.num_decodes(o.query_lens, cfg.decode_threshold)
    exp["plans"] = oracle.plans(cfg, o.seq_lens[d:], o.query_lens[d:], chunk_size)
    return exp


def test_chunk_size_is_an_area_not_a_request_count(backend):
    """Example A' keeps three prefill requests in one chunk with C = 2; a tight area
    splits them, and every chunk of the plan obeys the budget."""
    cfg, builder, inputs = _world(backend, chunk_size=1, max_model_len=32, max_num_seqs=8,
                                  max_num_batched_tokens=16)
    # c2a's area: 1 * (cdiv(32, 2) + 4 + 16) = 36; after the decode, prefills (L, q) give
    # c = [10, 2, 15, 3], g = [6, 4, 6, 6]: chunks (0, 2, 10, 16), (2, 3, 15, 21),
    # (3, 4, 3, 9).
    step, rs = example_step(cfg, [1, 3, 3, 3, 3], [9, 20, 4, 30, 6], [[1] * 8] * 5)
    meta = builder.build(stage_eager(inputs, step, rs))
    plan = meta.prefill_chunk_plans["c2a"].host
    assert plan == _plan_rows(meta)["c2a"] == [(0, 2, 10, 16), (2, 3, 15, 21), (3, 4, 3, 9)]
    oracle.assert_eager(meta, _with_chunk_size(
        oracle.expected_eager(cfg, oracle_step(step, rs, padded=True)), cfg, step, 1))
