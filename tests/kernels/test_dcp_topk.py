"""The exact top-k merge under decode context parallelism for prefill and decode rows
(``vllm-0.33-extras.md`` §7.1): the spec's worked examples, randomized rows against the
oracle (``staticattn/reference/dcp_topk.py``) and the single-GPU top-k with the ranks
simulated in one process, and two gloo ranks merging through :class:`DCPTopKMerge`."""

from __future__ import annotations

import pytest
import torch
from helpers.support import DEVICE
from hypothesis import given, settings
from hypothesis import strategies as st

from staticattn.arena import ArenaConfig
from staticattn.consumers.dcp.merge import EXACT_IDS, DCPTopKMerge
from staticattn.errors import ConfigError
from staticattn.kernels.dcp.topk_merge import merge_candidates, pack_candidates
from staticattn.reference import dcp_topk as oracle


def local_topk(scores: list[float], local_k: int) -> list[int]:
    """A rank's local top-k of one row: by score, ties to the smaller local index."""
    return oracle.exact_topk(scores, local_k)


def _simulate(rows: list[list[float]], world: int, interleave: int, topk: int,
              full_width: bool):
    """Every rank's pack of every row (the kernel) and the merge; returns (packs, merged)
    with packs[rank] a float64 ``(n, local_k, 2)``."""
    n = len(rows)
    local_k = max(1, min(topk, max(len(oracle.local_keys(len(r), world, 0, interleave))
                                   for r in rows)))
    cand = torch.zeros(world, n, local_k, 2, dtype=torch.float64, device=DEVICE)
    wants = []
    for rank in range(world):
        held = [[r[x] for x in oracle.local_keys(len(r), world, rank, interleave)] for r in rows]
        tops = [local_topk(h, local_k) for h in held]
        if full_width:  # one matrix over the chunk: each row's keys at its own start
            starts = [sum(len(h) for h in held[:i]) for i in range(n)]
            width = max(1, sum(len(h) for h in held))
            logits = [[0.0] * width for _ in range(n)]
            for i, h in enumerate(held):
                logits[i][starts[i]: starts[i] + len(h)] = h
        else:
            starts = [0] * n
            width = max(1, max(len(h) for h in held))
            logits = [h + [0.0] * (width - len(h)) for h in held]
        pack_candidates(torch.tensor(tops, device=DEVICE),
                        torch.tensor(logits, dtype=torch.float32, device=DEVICE),
                        torch.tensor(starts, device=DEVICE) if full_width else None,
                        cand[rank], world=world, rank=rank, interleave=interleave)
        wants.append([oracle.pack(t, lg, s, world, rank, interleave)
                      for t, lg, s in zip(tops, logits, starts)])
    out = torch.full((n, topk), 7, dtype=torch.int64, device=DEVICE)
    merge_candidates(cand, out)
    return cand, wants, out.tolist()


def _pairs(packed: torch.Tensor) -> list[list[tuple[float, int]]]:
    return [[(float(s), int(x)) for s, x in row] for row in packed.tolist()]


def test_the_prefill_rows_example_of_the_spec():
    """§7.1, world 2, I = 1, K = 2; each rank's workspace holds request A's keys then B's,
    the logits span the chunk (row starts [0, 4] on rank 0, [0, 3] on rank 1)."""
    a = [0.5, 3.0, 1.0, 2.5, 0.1, 4.0, 0.2]
    b = [9.0, 1.0, 8.0, 7.5, 2.0]
    cand, wants, merged = _simulate([a, b], 2, 1, 2, full_width=True)
    assert _pairs(cand[0]) == [[(1.0, 2), (0.5, 0)], [(9.0, 0), (8.0, 2)]]
    assert _pairs(cand[1]) == [[(4.0, 5), (3.0, 1)], [(7.5, 3), (1.0, 1)]]
    assert [_pairs(c) for c in cand] == wants
    assert merged == [[5, 1], [0, 2]]
    assert merged == [oracle.exact_topk(r, 2) for r in (a, b)]


def test_the_interleave_example_of_the_spec():
    """§7.1, one decode row, world 2, I = 2, K = 3: rank 0 packs ids [4, 1, 8], rank 1
    [7, 3, 6], merged {3, 4, 7}."""
    scores = [0.0, 5, 1, 6, 7, 2, 3, 8, 4]
    cand, _, merged = _simulate([scores], 2, 2, 3, full_width=False)
    assert [int(x) for x in cand[0, 0, :, 1].tolist()] == [4, 1, 8]
    assert [int(x) for x in cand[1, 0, :, 1].tolist()] == [7, 3, 6]
    assert merged == [[7, 4, 3]] == [oracle.exact_topk(scores, 3)]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_the_merge_is_exact(data):
    """Random rows (ties included: scores from a few values), worlds, interleaves and
    widths, row-local or chunk-wide logits: each rank's pack equals the oracle's, the merge
    equals the oracle's merge and the single-GPU top-k."""
    world = data.draw(st.sampled_from([2, 3, 4]))
    interleave = data.draw(st.sampled_from([1, 2, 4]))
    topk = data.draw(st.integers(1, 12))
    rows = data.draw(st.lists(st.lists(st.integers(-3, 5).map(float), max_size=40),
                              min_size=1, max_size=5))
    cand, wants, merged = _simulate(rows, world, interleave, topk,
                                    full_width=data.draw(st.booleans()))
    assert [_pairs(c) for c in cand] == wants
    every = [sum((w[i] for w in wants), []) for i in range(len(rows))]
    assert merged == [oracle.merge(c, topk) for c in every]
    assert merged == [oracle.exact_topk(r, topk) for r in rows]



def test_float32_candidates_keep_ids_up_to_the_limit_exact():
    """``DCPTopKMerge``'s float32 pairs (as the reference packs them), two ranks in one
    process: ids just below ``2 ** 24`` come back exact, and ties still go to the smaller
    id."""
    top = EXACT_IDS - 1
    # Interleave 1: local l of rank r is global 2 l + r.
    tops = [[[(top - 1) // 2, 0]], [[(top - 1) // 2, 3]]]
    scores = [[[1.5, 0.25]], [[1.5, 2.0]]]
    merges = [DCPTopKMerge(ArenaConfig.deepseek_v32(
        max_model_len=EXACT_IDS, dcp_world_size=2, dcp_rank=rank, device=DEVICE), topk=3,
        local_k=2, max_rows=1) for rank in range(2)]
    for rank, merge in enumerate(merges):
        merge.pack(torch.tensor(tops[rank], device=DEVICE),
                   torch.tensor(scores[rank], device=DEVICE))
    for merge in merges:  # the all-gather
        for rank, other in enumerate(merges):
            merge.candidates(1)[rank].copy_(other.candidates(1)[rank])
    assert [m.merged(1).tolist() for m in merges] == [[[7, top - 1, top]]] * 2


def test_a_context_past_exact_float32_ids_is_refused():
    cfg = ArenaConfig.deepseek_v32(max_model_len=EXACT_IDS + 64, dcp_world_size=2,
                                   dcp_rank=0, device="cpu")
    with pytest.raises(ConfigError, match="float32"):
        DCPTopKMerge(cfg, topk=64, local_k=64, max_rows=4)
