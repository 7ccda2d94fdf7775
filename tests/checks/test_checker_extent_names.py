"""The checker's finding names the extent a step depends on (:func:`~staticattn.checks.
extent_probe.extent_mismatch`): for each of the batch's static attributes a graph fixes at
capture (``EXTENT_FIELDS``, ``num_actual_tokens`` among them), a plain function reading
that one attribute is named with both values -- the capture's, then the step's own --
whichever other extents differ too; a step reading two of them is named by none. On CPU the
replay is the graph's body run at the capture extents (:func:`emulated_replay`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.support import DEVICE, quiet
from helpers.toy import ToyBuilder

from staticattn.arena import ArenaConfig
from staticattn.builders import make_arena
from staticattn.checks.extent_probe import EXTENT_FIELDS, emulated_replay, extent_mismatch
from staticattn.graphs import GraphManager

CFG = ArenaConfig.deepseek_v4(max_num_seqs=16, max_num_batched_tokens=128, max_model_len=2048,
                              num_speculative_tokens=1, device=DEVICE)
#: ``(query_lens, seq_lens)`` and the step's own extents: a uniform decode (a decode graph,
#: whose ``max_query_len`` is the step's), one of a captured size (the graph's counts are the
#: step's: it is the smallest that holds it), and a mixed step (every extent differs).
STEPS = {
    "decode": ([2, 2, 2], [300, 40, 9], dict(max_seq_len=300, max_query_len=2, num_reqs=3,
                                              num_actual_tokens=6)),
    "decode of a size": ([2, 2], [300, 40], dict(max_seq_len=300, max_query_len=2,
                                                  num_reqs=2, num_actual_tokens=4)),
    "mixed": ([2, 1, 30], [300, 40, 30], dict(max_seq_len=300, max_query_len=30, num_reqs=3,
                                               num_actual_tokens=33)),
}
#: The extents the replayed graph shares with each step: nothing to name there.
SHARED = {"decode": {"max_query_len"},
          "decode of a size": {"max_query_len", "num_reqs", "num_actual_tokens"},
          "mixed": set()}


class Reads:
    """A step whose every output row is the sum of the batch attributes ``names``."""

    def __init__(self, *names: str) -> None:
        self.names = names
        self.out = torch.zeros(CFG.max_num_batched_tokens, dtype=torch.int64, device=DEVICE)

    def __call__(self, batch, md) -> torch.Tensor:
        return self.out.fill_(sum(getattr(batch, name) for name in self.names))


def _finding(kind: str, step: Reads):
    q, s, own = STEPS[kind]
    q, s = np.array(q), np.array(s)
    slots = np.arange(int(q.sum()))
    builder = ToyBuilder()
    arena, inputs = make_arena(CFG, [builder])
    with GraphManager(arena, inputs, [builder], step, quiet()) as gm:
        capture_batch, replayed = emulated_replay(gm, q, s, slots)
        return extent_mismatch(gm, capture_batch, replayed, q, s, slots), capture_batch, own


@pytest.mark.parametrize("kind", list(STEPS))
@pytest.mark.parametrize("name", EXTENT_FIELDS)
def test_the_one_extent_read_is_named_with_both_values(kind, name):
    found, capture_batch, own = _finding(kind, Reads(name))
    captured = getattr(capture_batch, name)
    if name in SHARED[kind]:
        assert (captured, found) == (own[name], None)
        return
    assert found is not None and found.endswith(
        f": the step reads batch.{name} ({captured} at capture, {own[name]} for this step)"
    ), found


def test_every_extent_is_one_the_checker_may_name():
    assert set(EXTENT_FIELDS) == {"max_seq_len", "max_query_len", "num_reqs",
                                  "num_actual_tokens"}


@pytest.mark.parametrize("names", [("num_reqs", "num_actual_tokens"),
                                   ("max_seq_len", "num_actual_tokens")])
def test_a_step_reading_two_extents_is_named_by_neither(names):
    found, _, _ = _finding("mixed", Reads(*names))
    assert found is not None and found.endswith(
        ": the step depends on something capture fixes"), found
