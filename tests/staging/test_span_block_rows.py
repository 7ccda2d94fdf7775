"""The image-span block handed out after ``run()`` calls whose span counts fall from step to
step (``vllm-0.33-extras.md`` §3, :class:`~staticattn.staging.span_block.ImageSpans`):
``begin_step()`` marks unused every row any of those ``run()`` calls staged -- the most
rows since the last hand-out, not the last call's -- so an in-place launch that scans the
block (``launch(k, t)`` without ``num_spans``) finds only the rows the engine wrote. The
device block the SWA kernels read is checked after each scan."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from helpers.emulated_graphs import emulated
from helpers.support import DEVICE, quiet
from helpers.toy import ToyBuilder, ToyStep, toy_expected

from staticattn.arena import ArenaConfig
from staticattn.builders import make_arena
from staticattn.graphs import EagerBuild, GraphKind, GraphManager

CFG = ArenaConfig.preset("deepseek-v4-vision", max_num_seqs=4, max_num_batched_tokens=32,
                         max_model_len=256, max_image_tokens=16, max_image_spans=6,
                         device=DEVICE)
#: A step of two prefills whose contexts hold every span below (none overlapping).
Q, S = [8, 8], [40, 30]
SPANS = [(0, 0, 3), (0, 5, 7), (0, 10, 12), (1, 0, 2), (1, 4, 9), (1, 12, 15)]
UNUSED = [-1, -1, -1]


@functools.cache
def _world():
    builder = ToyBuilder()
    arena, inputs = make_arena(CFG, [builder])
    gm = GraphManager(arena, inputs, [builder], ToyStep(CFG, arena.device), quiet())
    cap = gm.capturer
    gm.dispatcher.add(emulated(cap.spec(GraphKind.MIXED, cap.context_len, 32)))
    return inputs, gm


def _scan(gm, inputs, rows) -> list:
    """An in-place step whose spans are found by a scan: the engine writes ``rows`` (the
    handed-out block's other rows it leaves as they are); the device block afterwards."""
    views = gm.begin_step()
    assert (views.image_spans[:, 0] == -1).all(), views.image_spans.tolist()
    views.seq_lens[:2], views.slot_mapping[:16] = S, np.arange(16)
    views.query_start_loc[:3] = [0, 8, 16]
    for i, row in rows:
        views.image_spans[i] = row
    assert gm.launch(2, 16)[:16].tolist() == toy_expected(Q, S)
    got = inputs.images.device.tolist()
    for i, _ in rows:  # the engine keeps the rows it wrote unused for the next step
        views.image_spans[i] = UNUSED
    return got


@pytest.mark.parametrize("eager", [None, EagerBuild.GRAPH, EagerBuild.REFERENCE])
@pytest.mark.parametrize("counts", [(6, 2), (5, 0), (1, 0), (3, 1, 2), (2, 6, 4, 1)],
                         ids=lambda c: "-".join(map(str, c)) if isinstance(c, tuple) else c)
def test_a_scan_after_falling_span_counts_finds_only_the_engines_rows(counts, eager):
    inputs, gm = _world()
    for m in counts:  # run() calls without a hand-out between them
        res = gm.run(Q, S, np.arange(16), image_spans=SPANS[:m] if m else None, eager=eager)
        assert res.outputs.tolist() == toy_expected(Q, S)
        assert inputs.images.device.tolist() == [list(r) for r in SPANS[:m]] + [UNUSED] * (
            CFG.max_image_spans - m)
    assert _scan(gm, inputs, []) == [UNUSED] * CFG.max_image_spans
    gm.run(Q, S, np.arange(16), image_spans=SPANS[: max(counts)], eager=eager)
    gm.run(Q, S, np.arange(16), image_spans=SPANS[:1], eager=eager)
    mine = [(4, SPANS[4])]  # the engine's one row, past the rows run() staged last
    assert _scan(gm, inputs, mine) == [UNUSED] * 4 + [list(SPANS[4]), UNUSED]
