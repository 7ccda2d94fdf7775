"""The checker's comparison of a replay with the manager's own eager path at the step's own
extents (:mod:`staticattn.checks.extent_probe`), on CPU through emulated replays (the graph's body
run eagerly at the capture extents): a step that reads a capture-time extent is caught and
the attribute named; a correct step passes; integer outputs compare bit for bit, floats
within the stated tolerance."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.support import DEVICE, quiet
from helpers.toy import ToyBuilder, ToyStep

from staticattn.arena import ArenaConfig
from staticattn.builders import make_arena
from staticattn.checks import check_eagerly
from staticattn.checks.extent_probe import (
    emulated_replay,
    extent_mismatch,
    float_tolerance,
    outputs_differ,
)
from staticattn.graphs import GraphManager

CFG = ArenaConfig.deepseek_v4(max_num_seqs=16, max_num_batched_tokens=128, max_model_len=2048,
                              num_speculative_tokens=1, device=DEVICE)


class ReadsExtent(ToyStep):
    """The toy step plus one of the batch's static attributes: what a graph fixes at
    capture (a wrong step, for the negative control)."""

    def __init__(self, config: ArenaConfig, device, name: str) -> None:
        super().__init__(config, device)
        self.name = name

    def __call__(self, batch, md) -> torch.Tensor:
        out = super().__call__(batch, md)
        return out.add_(getattr(batch, self.name))


class FloatStep(ToyStep):
    """The toy step in float32, ``wobble`` x ``max_seq_len`` added: a float output whose
    dependence on the extent is within (or past) the tolerance."""

    def __init__(self, config: ArenaConfig, device, wobble: float) -> None:
        super().__init__(config, device)
        self.wobble = wobble
        self.real = torch.zeros(config.max_num_batched_tokens, device=device)

    def __call__(self, batch, md) -> torch.Tensor:
        out = super().__call__(batch, md)
        n = batch.num_actual_tokens
        return torch.add(out.float(), self.wobble * batch.max_seq_len, out=self.real[:n])


def _manager(step_of):
    b = ToyBuilder()
    arena, inputs = make_arena(CFG, [b])
    return GraphManager(arena, inputs, [b], step_of(arena.device), quiet())


STEPS = {  # (query_lens, seq_lens): a uniform decode (a decode graph) and a mixed step
    "decode": ([2, 2, 2], [300, 40, 9]),
    "mixed": ([2, 1, 30], [300, 40, 30]),
}


def _mismatch(gm, kind: str) -> str | None:
    q, s = (np.array(x) for x in STEPS[kind])
    slots = np.arange(int(q.sum()))
    emulated = emulated_replay(gm, q, s, slots)
    assert emulated is not None
    return extent_mismatch(gm, *emulated, q, s, slots)


@pytest.mark.parametrize("kind", list(STEPS))
@pytest.mark.parametrize("name", ["max_seq_len", "max_query_len"])
def test_a_step_reading_a_capture_extent_is_named(kind, name):
    with _manager(lambda dev: ReadsExtent(CFG, dev, name)) as gm:
        found = _mismatch(gm, kind)
    if name == "max_query_len" and kind == "decode":
        assert found is None  # a decode graph's max_query_len is the step's own, next_n
        return
    assert found is not None and f"reads batch.{name} (" in found, found


@pytest.mark.parametrize("kind", list(STEPS))
def test_a_correct_step_agrees_at_every_extent(kind):
    with _manager(lambda dev: ToyStep(CFG, dev)) as gm:
        assert _mismatch(gm, kind) is None


def test_check_eagerly_counts_extent_mismatches():
    """A step reading ``batch.num_reqs``: the graph builds and the reference builds agree at
    the step's own extents, so only the emulated replay (padded requests) tells."""
    with _manager(lambda dev: ReadsExtent(CFG, dev, "num_reqs")) as gm:
        bad = check_eagerly(gm, num_steps=6, seed=1, max_seq_len=1024)
    assert not bad.ok and bad.output_mismatches == 0 and bad.extent_mismatches >= 3
    assert "reads batch.num_reqs (" in bad.first_mismatch, bad.first_mismatch
    assert (f"replay (emulated) vs the eager step at its own extents: {bad.extent_mismatches}"
            in "\n".join(bad.lines()))
    with _manager(lambda dev: ToyStep(CFG, dev)) as gm:
        good = check_eagerly(gm, num_steps=6, seed=1, max_seq_len=1024)
    assert good.ok and good.extent_mismatches == 0


@pytest.mark.parametrize("wobble, caught", [(1e-7, False), (1e-3, True)])
def test_floats_compare_within_the_stated_tolerance(wobble, caught):
    with _manager(lambda dev: FloatStep(CFG, dev, wobble)) as gm:
        found = _mismatch(gm, "mixed")
    assert (found is not None) == caught, found
    if caught:
        assert "batch.max_seq_len" in found and "past rtol" in found


def test_integers_compare_bit_for_bit():
    a = [torch.arange(6), torch.zeros(3, dtype=torch.bool)]
    assert outputs_differ(a, [x.clone() for x in a]) is None
    b = [a[0].clone(), a[1].clone()]
    b[0][4] += 1
    assert outputs_differ(a, b) == "output 0 (torch.int64): row 4 differs"
    f = torch.linspace(0, 1, 5)
    assert outputs_differ([f], [f + float_tolerance(f.dtype)[1] / 10]) is None
    assert outputs_differ([f], [f[:4]]).startswith("output 0: (5,)")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_floats_pass_a_reduction_order_and_fail_an_extent(dtype):
    """One unit in the last place (another reduction order) passes at every magnitude; a
    shift of 1/8 (what reading a capture-time extent moves) fails."""
    x = torch.tensor([1.5, -0.3, 0.01, 0.0, 7.0], dtype=dtype)
    ulp = torch.nextafter(x.float().abs().to(dtype), torch.tensor(float("inf"), dtype=dtype))
    one_ulp = torch.where(x >= 0, ulp, -ulp)
    assert outputs_differ([x], [one_ulp]) is None
    assert outputs_differ([x], [x + 0.125]) is not None
