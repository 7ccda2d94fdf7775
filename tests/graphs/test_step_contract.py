"""The step contract of the in-place API: each ``begin_step()`` hands out one step, and
``launch()`` takes only a step begun and not yet launched. Every misuse is a typed error
that says what to do, writes nothing, and the next good step still runs (on CPU the graphs
are emulated by their bodies run eagerly; the GPU test holds a replay in flight)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.support import DEVICE, quiet
from helpers.toy import ToyBuilder, ToyStep, emulated_graph, toy_expected

from staticattn.arena import ArenaConfig
from staticattn.builders import make_arena
from staticattn.errors import GraphError, InvalidBatchError
from staticattn.graphs import DeviceLengthSteps, GraphKind, GraphManager

N_REQS = 3


def _manager():
    cfg = ArenaConfig.deepseek_v4(max_num_seqs=8, max_num_batched_tokens=64,
                                  max_model_len=1024, device=DEVICE)
    b = ToyBuilder()
    arena, inputs = make_arena(cfg, [b])
    gm = GraphManager(arena, inputs, [b], ToyStep(cfg, arena.device), quiet())
    n = cfg.next_n
    gm.dispatcher.add(emulated_graph(gm, GraphKind.DECODE, N_REQS * n),
                      emulated_graph(gm, GraphKind.MIXED, 16))
    return cfg, arena, gm


def _write(gm, seq_lens, q=None):
    """The engine's writes of a step into the views last handed out (``q``: a step of any
    composition, else a uniform decode step)."""
    views = gm.host
    k, n = len(seq_lens), gm.config.next_n
    t = k * n if q is None else int(sum(q))
    views.seq_lens[:k], views.slot_mapping[:t] = seq_lens, np.arange(t)
    if q is not None:
        views.query_start_loc[: k + 1] = np.concatenate(([0], np.cumsum(q)))
    return k, t


def _state(arena, gm) -> tuple:
    """Everything a refused launch must leave as it was: every buffer, the counts."""
    return ({name: arena[name].clone() for name in arena.names()}, gm.stats)


def _same(before, after) -> bool:
    buffers, stats = before
    return (all(torch.equal(after[0][name], was) for name, was in buffers.items())
            and after[1] == stats)


@pytest.mark.parametrize("uniform", [True, False], ids=["launch(k)", "launch(k, t)"])
def test_a_launch_without_begin_step_is_refused_and_writes_nothing(uniform):
    cfg, arena, gm = _manager()
    n = cfg.next_n
    q = None if uniform else [n, 5]
    seq = [100, 200, 300] if uniform else [100, 200]

    def launch(k, t):
        return gm.launch(k) if uniform else gm.launch(k, t)

    k, t = _write(gm, seq, q)  # the views written with no step begun
    before = _state(arena, gm)
    with pytest.raises(GraphError, match=r"begin_step\(\)"):
        launch(k, t)
    assert _same(before, _state(arena, gm))
    gm.begin_step()  # the next good step runs
    _write(gm, seq, q)
    assert launch(k, t)[:t].tolist() == toy_expected(q or [n] * k, seq)
    before = _state(arena, gm)
    with pytest.raises(GraphError, match="once"):  # launched: a second launch is refused
        launch(k, t)
    assert _same(before, _state(arena, gm))


def test_a_step_staged_by_another_entry_ends_the_hand_out():
    """``run`` writes the staging itself: the views handed out before it are no longer a
    step to launch. A device-length step refused before anything is written leaves them
    so."""
    cfg, arena, gm = _manager()
    n = cfg.next_n
    gm.begin_step()
    _write(gm, [10, 20, 30])
    assert gm.run([n], [40], np.arange(n)).outputs.tolist() == toy_expected([n], [40])
    with pytest.raises(GraphError, match=r"begin_step\(\)"):
        gm.launch(3)
    steps = DeviceLengthSteps(gm, lambda inputs, r, t: None)
    gm.begin_step()
    _write(gm, [10, 20, 30])
    with pytest.raises(InvalidBatchError):  # refused before anything is written
        steps.launch(0, 4)
    assert gm.launch(3)[: 3 * n].tolist() == toy_expected([n] * 3, [10, 20, 30])


def test_a_refused_launch_leaves_the_step_begun():
    """A launch refused by a check writes nothing; the engine mends the views and launches
    the same step."""
    cfg, arena, gm = _manager()
    n = cfg.next_n
    gm.begin_step()
    k, _ = _write(gm, [10, cfg.max_model_len + 1, 30])
    before = _state(arena, gm)
    with pytest.raises(Exception, match="max_model_len"):
        gm.launch(k)
    assert _same(before, _state(arena, gm))
    gm.host.seq_lens[1] = 20
    assert gm.launch(k)[: k * n].tolist() == toy_expected([n] * k, [10, 20, 30])


def test_a_closed_manager_hands_out_no_step():
    _, _, gm = _manager()
    gm.begin_step()
    gm.close()
    for call in (gm.begin_step, lambda: gm.launch(1)):
        with pytest.raises(GraphError, match="closed"):
            call()
