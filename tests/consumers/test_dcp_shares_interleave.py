"""Per-rank SWA shares under decode context parallelism at an interleave above 1
(``vllm-0.33-extras.md`` §7.2): the window's positions dealt to the ranks in groups of ``I``
tokens, ``own_r(x) = (x // I) % world == r``. The kernel on both backends and
:class:`DCPRankShares` (``swa_interleave=I``) against the oracle
(``staticattn/reference/dcp_shares.py``), each rank's row compact with -1 after its length,
and the ranks' rows a partition of the single-GPU row."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.support import DEVICE, make_step, stage

from staticattn.arena import ArenaConfig
from staticattn.builders import make_arena
from staticattn.builders.swa.builder import SparseSWAMetadataBuilder
from staticattn.consumers.dcp.shares import DCPRankShares
from staticattn.kernels.dcp.rank_shares import swa_rank_share
from staticattn.reference import dcp_shares as oracle
from staticattn.reference import v41_compressed

I32 = dict(dtype=torch.int32, device=DEVICE)
W, BS = 8, 4
#: Decode positions: the first tokens (a window shorter than ``W``), groups cut anywhere.
POSITIONS = [0, 1, 2, 5, 6, 7, 10, 13, 22, 37]


def _kernel_rows(backend, table, world, rank, interleave):
    """The rank's shares of a decode token at each of :data:`POSITIONS` (request ``t % 2``),
    plus one invalid token (length 0), from the single-GPU rows; ``(rows, whole rows)``."""
    whole = [oracle.swa_share(p, W, table[t % 2], BS, 1, 0)
             for t, p in enumerate(POSITIONS)] + [[]]
    rows = torch.tensor([r + [-1] * (W - len(r)) for r in whole], **I32)
    n = len(whole)
    out = torch.full((n, W), 9, **I32)
    lens = torch.full((n,), 9, **I32)
    swa_rank_share(backend, rows, torch.tensor([len(r) for r in whole], **I32),
                   torch.tensor(POSITIONS + [3], device=DEVICE), out, lens, num_rows=n,
                   world=world, rank=rank, interleave=interleave)
    return [r[:k] for r, k in zip(out.tolist(), lens.tolist())], out.tolist(), whole


@pytest.mark.parametrize(("world", "interleave"), [(2, 2), (2, 4), (3, 2), (2, 3)])
def test_the_kernel_deals_groups_of_interleave_tokens(backend, world, interleave):
    table = [[20, 21, 22, 23, 24, 25, 26, 27, 28, 29], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39]]
    every = None
    for rank in range(world):
        got, raw, whole = _kernel_rows(backend, table, world, rank, interleave)
        want = [oracle.swa_share(p, W, table[t % 2], BS, world, rank, interleave)
                for t, p in enumerate(POSITIONS)] + [[]]
        assert got == want, rank
        assert all(x == -1 for r, g in zip(raw, got) for x in r[len(g):])
        every = [[*a, *b] for a, b in zip(every, got)] if every else got
    assert [sorted(r) for r in every] == [sorted(r) for r in whole]


def test_the_spec_example_at_interleave_two():
    """W = 6, bs = 4, a decode at p = 10 whose window is positions 5..10 at slots
    ``[85..90]``; world 2, I = 2: positions 5, 8, 9 are rank 0's, 6, 7, 10 rank 1's."""
    table = [20, 21, 22]
    assert [oracle.swa_share(10, 6, table, 4, 2, r, 2) for r in (0, 1)] == [
        [85, 88, 89], [86, 87, 90]]


@pytest.mark.parametrize("interleave", [2, 4])
def test_rank_shares_of_built_rows_at_an_interleave(backend, interleave):
    """Through the SWA builder: decodes of 2 tokens (one invalid) and a prefill; each
    rank's window against the oracle, the ranks' windows a partition of the built row."""
    cfg = ArenaConfig.deepseek_v4(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=512,
                                  num_sms=8, device=DEVICE, kernel_backend=backend)
    builder = SparseSWAMetadataBuilder()
    _, inputs = make_arena(cfg, [builder])
    step = make_step(cfg, [2, 2, 2, 20], [3, 130, 261, 40], invalid_tokens=(3,),
                     rng=np.random.default_rng(interleave))
    batch = stage(inputs, step)
    swa = builder.build(batch)
    td = swa.num_decode_tokens
    owner, position, own = v41_compressed.tokens(step)
    whole = swa.decode_swa_indices.reshape(td, cfg.sliding_window).tolist()
    whole_lens = swa.decode_swa_lens.tolist()
    every = [[] for _ in range(td)]
    world = 2
    for rank in range(world):
        shares = DCPRankShares(cfg.replace(dcp_world_size=world, dcp_rank=rank,
                                           cp_kv_cache_interleave_size=4),
                               swa_interleave=interleave)
        out = shares(batch, {"swa": swa})
        rows, lens = out["swa"].tolist(), out["swa_lens"].tolist()
        for t in range(td):
            b, p = owner[t], position[t]
            want = oracle.swa_share(p, cfg.sliding_window, step.swa_block_table[b],
                                    cfg.swa_block_size, world, rank,
                                    interleave) if own[t] >= 0 else []
            assert rows[t][: lens[t]] == want and set(rows[t][lens[t]:]) <= {-1}, (t, rank)
            every[t] += want
    assert [sorted(r) for r in every] == [sorted(r[:n]) for r, n in zip(whole, whole_lens)]
    assert any(len(r) > 2 * interleave for r in every)  # windows span several groups
