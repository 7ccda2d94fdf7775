"""The field hazards (``helpers/field_bugs.py``) named on CPU, as the checker names them.

The checker compares the captured body's calls with the eager body's on the first step whose
replay differs (:func:`~staticattn.checks.frozen.frozen_cause`); here the capture is the
graph's body run at the warm-up's staging (what a capture records), and the eager run the
same body on a later step. The padded token count is an extent the graph fixes, named by
the extent probe against an emulated replay. Each twin gives nothing to name. Last, the
rules of :func:`frozen_cause` on calls written by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.field_bugs import (
    DoubleBufferedStep,
    HostPlanStep,
    LastTokenStep,
    PackedTableStep,
    ShortcutStep,
)
from helpers.support import DEVICE, quiet
from helpers.toy import ToyBuilder

from staticattn.arena import ArenaConfig
from staticattn.builders import make_arena
from staticattn.checks.extent_probe import emulated_replay, extent_mismatch
from staticattn.checks.frozen import Call, Seen, frozen_cause
from staticattn.checks.guarded_capture import PhasedStep, body_calls
from staticattn.checks.watch import ArenaIndex
from staticattn.graphs import GraphKind, GraphManager

CFG = ArenaConfig.deepseek_v4(max_num_seqs=32, max_num_batched_tokens=256,
                              max_model_len=8192, device=DEVICE)
#: The captured size (tokens, one per request) and the later step: three long requests.
SIZE = 8
QUERY_LENS, SEQ_LENS = np.ones(3, dtype=np.int32), np.array([300, 700, 2000], dtype=np.int32)


def _managed(make_step):
    builder = ToyBuilder()
    arena, inputs = make_arena(CFG, [builder])
    step = make_step(arena.device, inputs)
    return step, GraphManager(arena, inputs, [builder], PhasedStep(step), quiet())


def _frozen(make_step, engine_update: bool = False):
    """What the first call that differs names: the body at the warm-up's staging (warmed
    up first, as a capture is) against the body on the later step (the engine's update
    between them, where it has one)."""
    step, gm = _managed(make_step)
    with gm:
        index, device_type = ArenaIndex.of(gm.arena), gm.arena.device.type
        gm.capturer.stage_warm_up(GraphKind.DECODE, SIZE, SIZE)
        gm.capturer.body(GraphKind.DECODE, SIZE, SIZE)  # the warm-up, before the capture
        _, captured = body_calls(gm, SIZE, SIZE, index, device_type)
        if engine_update:
            step.update(1)
        gm.inputs.stage(QUERY_LENS, SEQ_LENS, np.arange(3), num_reqs_padded=SIZE,
                        num_tokens_padded=SIZE)
        _, calls = body_calls(gm, SIZE, SIZE, index, device_type)
    return frozen_cause(captured, calls)


def test_a_plan_computed_on_the_host_at_capture_is_a_frozen_value():
    kind, message = _frozen(lambda dev, inputs: HostPlanStep(CFG, dev, inputs))
    assert kind == "frozen_value", message
    assert message.startswith("'fill_' (step) at field_bugs.py:"), message
    # Request 0: 300 tokens plan ceil(300 / 64) = 5 splits; the warm-up's 1 token, 1.
    assert "argument 'value' is 5 for this step, 1 at capture" in message, message


def test_a_shortcut_chosen_at_capture_is_a_frozen_branch():
    kind, message = _frozen(lambda dev, inputs: ShortcutStep(CFG, dev, inputs))
    assert kind == "frozen_branch", message
    assert message.startswith("this step ran 'clamp_' (step) at field_bugs.py:"), message
    assert "where the capture ran 'add_' (step) at field_bugs.py:" in message, message


def test_a_row_stride_of_the_capture_is_a_frozen_stride():
    kind, message = _frozen(lambda dev, inputs: PackedTableStep(CFG, dev), engine_update=True)
    assert kind == "frozen_stride", message
    assert message.startswith("'as_strided' (step) at field_bugs.py:"), message
    assert "gives strides (3,) for this step, (2,) at capture" in message, message


def test_a_buffer_handed_anew_each_step_is_a_frozen_address():
    kind, message = _frozen(lambda dev, inputs: DoubleBufferedStep(CFG, dev),
                            engine_update=True)
    assert kind == "frozen_address", message
    assert message.startswith("'slice' (step) at field_bugs.py:"), message
    assert "reads int64[256] (external) at another address than at capture" in message


@pytest.mark.parametrize("make_step, engine_update", [
    (lambda dev, inputs: HostPlanStep(CFG, dev, inputs, on_device=True), False),
    (lambda dev, inputs: ShortcutStep(CFG, dev, inputs, bounded=True), False),
    (lambda dev, inputs: PackedTableStep(CFG, dev, fixed=True), True),
    (lambda dev, inputs: DoubleBufferedStep(CFG, dev, in_place=True), True),
    (lambda dev, inputs: LastTokenStep(CFG, dev), False),
], ids=["plan-on-device", "bounded", "fixed-stride", "in-place", "padded-count"])
def test_every_twin_runs_the_captured_calls(make_step, engine_update):
    """The twins, and the padded count (the same calls: only the extent differs)."""
    assert _frozen(make_step, engine_update) is None


@pytest.mark.parametrize("device_count", [False, True], ids=["padded-count", "device-count"])
def test_the_padded_token_count_is_the_extent_named(device_count):
    step, gm = _managed(lambda dev, inputs: LastTokenStep(CFG, dev, device_count))
    with gm:
        slots = np.arange(3)
        capture_batch, replayed = emulated_replay(gm, QUERY_LENS, SEQ_LENS, slots)
        found = extent_mismatch(gm, capture_batch, replayed, QUERY_LENS, SEQ_LENS, slots)
    if device_count:
        assert found is None
    else:  # the graph's count: the smallest decode size holding 3 tokens
        padded = capture_batch.num_actual_tokens
        assert padded > 3 and found is not None and found.endswith(
            f"the step reads batch.num_actual_tokens ({padded} at capture, 3 for this step)"
        ), found


def _call(op: str, *args, source: str = "step.py:3", out=((1,),)) -> Call:
    return Call(op, "step", tuple((f"arg{i}", a) for i, a in enumerate(args)), out, source)


#: A tensor of the arena, on the device.
DEVICE = Seen("arena", 1, "int64", (4,), (1,))


def test_a_host_read_of_the_step_is_not_itself_frozen():
    """The graph holds no host op: a host read of the step's data (``int(t.max())`` on a
    pinned tensor) differs from step to step; the device calls that follow tell whether
    capture froze what it decided."""
    reads = [_call("_local_scalar_dense", Seen("host", v, "int64", (), ()), source="step.py:2")
             for v in (2, 2000)]
    device = [_call("add_", DEVICE, 1)]
    assert frozen_cause(reads[:1] + device, reads[1:] + device) is None
    kind, _ = frozen_cause(reads[:1] + device, reads[1:] + [_call("clamp_", DEVICE, 1)])
    assert kind == "frozen_branch"


def test_a_run_that_goes_on_after_the_capture_stopped_is_a_branch():
    both = [_call("add_", 1)]
    kind, message = frozen_cause(both, both + [_call("mul_", 2, source="step.py:9")])
    assert kind == "frozen_branch"
    assert message.startswith("this step ran 'mul_' (step) at step.py:9 after the 1 calls "
                              "both ran"), message
    assert frozen_cause(both, list(both)) is None


def test_the_same_op_from_another_line_is_a_branch():
    kind, _ = frozen_cause([_call("add_", 1)], [_call("add_", 1, source="step.py:4")])
    assert kind == "frozen_branch"


def test_a_host_scalar_tensor_is_a_value_and_a_stride_argument_a_stride():
    host = [Seen("host", v, "int64", (), ()) for v in (4, 9)]
    kind, message = frozen_cause([_call("add_", DEVICE, host[0])],
                                 [_call("add_", DEVICE, host[1])])
    assert (kind, message.split(": a value")[0]) == (
        "frozen_value", "'add_' (step) at step.py:3: argument 'arg1' is 9 for this step, 4 at "
        "capture")
    strided = [Call("as_strided", "step", (("stride", (s, 1)),), (), "step.py:3")
               for s in (64, 320)]
    kind, message = frozen_cause(strided[:1], strided[1:])
    assert kind == "frozen_stride" and "strides (320, 1) for this step, (64, 1) at" in message


def test_a_view_of_another_row_width_is_a_stride_not_a_size():
    """``flat.view(-1, width)`` with the width from the step's data: its ``size`` argument
    differs too, but the strides of what it gives name the cause."""
    views = [_call("view", (-1, w), out=((w, 1),)) for w in (64, 320)]
    kind, message = frozen_cause(views[:1], views[1:])
    assert kind == "frozen_stride" and "strides (320, 1) for this step, (64, 1) at" in message
