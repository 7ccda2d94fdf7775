"""``replay_start`` on a step with no prefill request (``docs/spec/deepseek-v41.md`` §8.1):
every request is a decode, so every non-zero start is one the staging would drop without a
word (it stages starts for prefill requests only) and must be refused, wherever it sits,
through :func:`check_replay_start`, ``GraphManager.run`` (the uniform decode steps that
would take the replay fast path included) and the in-place ``launch(k, t)``; all zeros
pass, and such a step stages no start on the device, even after a step that replayed."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from helpers.emulated_graphs import graphs_for
from helpers.support import quiet
from helpers.toy import ToyBuilder, ToyStep, toy_expected
from helpers.v41_swa_steps import EXAMPLE_V41

from staticattn.arena import ArenaConfig
from staticattn.builders import make_arena
from staticattn.errors import InvalidBatchError
from staticattn.graphs import GraphManager
from staticattn.validation.replay_start import check_replay_start

CFG = ArenaConfig(**EXAMPLE_V41)  # next_n 2: a query of at most 2 tokens is a decode

#: All-decode steps ``(query_lens, seq_lens)``: uniform (a decode graph's), of unequal
#: lengths (a token bucket's), with a zero-token request, and of one request.
DECODES = {
    "uniform": ([2, 2, 2], [9, 14, 5]),
    "unequal": ([1, 2, 1, 2], [6, 9, 12, 3]),
    "zero tokens": ([2, 0, 1], [7, 4, 10]),
    "one": ([1], [11]),
}


def _starts(k: int, at: int) -> np.ndarray:
    """Starts of ``k`` requests, 1 (inside every context above) at ``at`` only."""
    rs = np.zeros(k, dtype=np.int32)
    rs[at] = 1
    return rs


def _cases():
    return [(name, at) for name, (q, _) in DECODES.items() for at in range(len(q))]


@pytest.mark.parametrize(("name", "at"), _cases())
def test_a_start_at_any_decode_is_refused(name, at):
    q, s = (np.asarray(x) for x in DECODES[name])
    with pytest.raises(InvalidBatchError, match=rf"replay_start\[{at}\]=1 is given for a "
                       rf"decode \(query_lens\[{at}\]={q[at]} <= decode_threshold=2"):
        check_replay_start(CFG, _starts(len(q), at), q, s)
    check_replay_start(CFG, np.zeros(len(q), dtype=np.int32), q, s)


def test_the_last_decode_before_a_prefill_is_still_a_decode():
    """The boundary the all-decode case shares with a mixed step: a start on the prefill
    passes, one on the decode just in front of it does not."""
    q, s = np.array([2, 1, 5]), np.array([9, 8, 12])
    check_replay_start(CFG, np.array([0, 0, 3]), q, s)
    with pytest.raises(InvalidBatchError, match=r"replay_start\[1\]=3 is given for a decode"):
        check_replay_start(CFG, np.array([0, 3, 3]), q, s)


@functools.cache
def _world():
    builder = ToyBuilder()
    arena, inputs = make_arena(CFG, [builder])
    gm = GraphManager(arena, inputs, [builder], ToyStep(CFG, arena.device), quiet())
    graphs_for(gm)
    return inputs, gm


def _written(inputs, gm) -> list:
    """What a refused step must leave as it was: the host staging, the device's starts,
    the manager's step counts."""
    h = inputs.host
    return [a.tolist() for a in (h.query_start_loc, h.seq_lens, h.slot_mapping, h.counts,
                                 h.replay_start)] + [
        inputs.replay_start.tolist(), dict(gm.stats.replays), dict(gm.stats.eager)]


def _replayed_before(gm) -> None:
    """A mixed step whose prefill replays from 4: the device holds a non-zero start."""
    gm.run([2, 8], [9, 14], np.arange(10), replay_start=[0, 4])
    assert gm.inputs.replay_start.tolist()[:2] == [0, 4]


@pytest.mark.parametrize("name", list(DECODES))
def test_run_refuses_a_decode_start_and_stages_none(name):
    inputs, gm = _world()
    q, s = (np.asarray(x) for x in DECODES[name])
    slots = np.arange(int(q.sum()))
    _replayed_before(gm)
    for at in range(len(q)):
        before = _written(inputs, gm)
        with pytest.raises(InvalidBatchError, match=rf"replay_start\[{at}\]=1 is given"):
            gm.run(q, s, slots, replay_start=_starts(len(q), at))
        assert _written(inputs, gm) == before
    res = gm.run(q, s, slots, replay_start=np.zeros(len(q), dtype=np.int32))
    assert res.outputs.tolist() == toy_expected(q, s)
    if name != "uniform":  # a uniform decode graph stages no start and reads none
        assert inputs.replay_start.tolist() == [0] * CFG.max_num_seqs


@pytest.mark.parametrize("name", list(DECODES))
def test_launch_refuses_a_decode_start_and_stages_none(name):
    """``launch(k, t)`` checks the written starts (``launch(k)``, a uniform decode step,
    reads none)."""
    inputs, gm = _world()
    q, s = DECODES[name]
    k, t = len(q), sum(q)
    _replayed_before(gm)
    for at in [*range(k), None]:
        views = gm.begin_step()
        views.seq_lens[:k], views.slot_mapping[:t] = s, np.arange(t)
        views.query_start_loc[: k + 1] = np.concatenate([[0], np.cumsum(q)])
        views.replay_start[:k] = 0 if at is None else _starts(k, at)
        if at is None:
            assert gm.launch(k, t)[:t].tolist() == toy_expected(q, s)
            assert inputs.replay_start.tolist() == [0] * CFG.max_num_seqs
            continue
        before = _written(inputs, gm)
        with pytest.raises(InvalidBatchError, match=rf"replay_start\[{at}\]=1 is given"):
            gm.launch(k, t)
        assert _written(inputs, gm) == before
        if name == "uniform":
            assert gm.launch(k)[:t].tolist() == toy_expected(q, s)
