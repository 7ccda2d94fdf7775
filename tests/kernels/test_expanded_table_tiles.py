"""The flattened indexer's expanded block table over a run of steps on one buffer: real rows
copy their request's whole table row, padding rows inside the step's view are all 0, rows
past the view keep what they held, and a tile the kernel skips (its flag clear) is all 0.

The oracle is a shadow of the whole buffer, updated per step by plain loops; steps change
the view (``num_rows``, a graph's decode capacity) and the real decode tokens, so tiles are
dirtied by one view and must be cleared by another."""

from __future__ import annotations

import torch
from helpers.support import DEVICE, fuzz_examples
from hypothesis import given, settings
from hypothesis import strategies as st

from staticattn.kernels.indexer.decode_tensors import ExpandedTable, indexer_decode_tensors
from staticattn.kernels.indexer.indexer_kernel import BLOCK, COLS, table_tiles_shape
from staticattn.kernels.staging.stage_inputs import COUNT_DECODE_TOKENS, COUNT_DECODES

ROWS, COLUMNS, REQS = 3 * BLOCK - 5, 2 * COLS + 3, 40
RATIO = 4

#: One step: (num_rows, real decode tokens), the tokens at most the rows.
steps = st.lists(
    st.integers(1, ROWS).flatmap(lambda rows: st.tuples(st.just(rows), st.integers(0, rows))),
    min_size=1, max_size=6)


def _run(backend: str, plan: list[tuple[int, int]], seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    i32 = dict(dtype=torch.int32, device=DEVICE)
    block_table = torch.randint(1, 1000, (REQS, COLUMNS), generator=g).to(**i32)
    table = torch.zeros(ROWS, COLUMNS, **i32)
    tiles = torch.zeros(table_tiles_shape(ROWS, COLUMNS), **i32)
    shadow = table.cpu().clone()
    lens, seq_lens = torch.zeros(ROWS, **i32), torch.zeros(ROWS, **i32)
    for num_rows, live in plan:
        token_to_req = torch.randint(0, REQS, (ROWS,), generator=g).to(**i32)
        positions = torch.randint(0, 5000, (ROWS,), generator=g).to(DEVICE)
        counts = torch.zeros(4, **i32)
        counts[COUNT_DECODES] = counts[COUNT_DECODE_TOKENS] = live
        qsl = torch.arange(ROWS + 1, **i32)
        indexer_decode_tensors(
            backend, qsl, seq_lens, block_table, positions, token_to_req, lens, seq_lens,
            ExpandedTable(table, tiles), num_decodes=num_rows, num_rows=num_rows, width=1,
            compress_ratio=RATIO, step_counts=counts)
        for t in range(num_rows):  # the oracle: the view rewritten, the rest kept
            shadow[t] = block_table[token_to_req[t]].cpu() if t < live else 0
        assert torch.equal(table.cpu(), shadow), (num_rows, live)
        want_lens = [(int(positions[t]) + 1) // RATIO if t < live else 0
                     for t in range(num_rows)]
        assert seq_lens[:num_rows].tolist() == want_lens
        # A clear flag promises an all-0 tile (the kernel will not look at it again).
        for (rb, cb), flag in zip(torch.cartesian_prod(*map(torch.arange, tiles.shape)),
                                  tiles.flatten().tolist()):
            tile = shadow[rb * BLOCK:(rb + 1) * BLOCK, cb * COLS:(cb + 1) * COLS]
            assert flag or not tile.any(), (int(rb), int(cb), num_rows, live)


def test_a_small_view_after_a_large_one_then_an_empty_large_one(backend):
    # 300 real rows dirty three row tiles; a view of 200 rows clears only what it sees (the
    # second tile up to row 200, with no real row in it); an empty view of every row must
    # then clear the rest, that straddled tile included.
    _run(backend, [(ROWS, 300), (200, 7), (ROWS, 0), (ROWS, 130), (BLOCK, BLOCK), (ROWS, 1)],
         seed=1)


def test_random_runs_of_steps(backend):
    @settings(max_examples=fuzz_examples(backend, full=40, interpreted=6))
    @given(plan=steps, seed=st.integers(0, 2**16))
    def check(plan, seed):
        _run(backend, plan, seed)

    check()
