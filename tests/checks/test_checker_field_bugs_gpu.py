"""The field hazards on the GPU: each planted step (``helpers/field_bugs.py``) freezes at capture
something that depends on the step, and the checker fails it with a finding that names what
was frozen; each legitimate twin passes with no finding at all."""

from __future__ import annotations

import pytest
from helpers.checker_steps import fails_with, passes, run_check
from helpers.field_bugs import (
    DoubleBufferedStep,
    HostPlanStep,
    LastTokenStep,
    PackedTableStep,
    ShortcutStep,
)

pytestmark = pytest.mark.gpu

#: hazard -> (the step from ``(cfg, device, inputs, twin)``, whether the engine updates it
#: between steps (its ``update(i)``), the finding of the fault, words its message holds).
HAZARDS = {
    "plan-at-warm-up": (
        lambda cfg, dev, inputs, twin: HostPlanStep(cfg, dev, inputs, on_device=twin), False,
        "frozen_value", ("'fill_' (step) at field_bugs.py:", "argument 'value' is",
                         ", 1 at capture")),
    "short-context-shortcut": (
        lambda cfg, dev, inputs, twin: ShortcutStep(cfg, dev, inputs, bounded=twin), False,
        "frozen_branch", ("this step ran 'clamp_' (step) at field_bugs.py:",
                          "where the capture ran 'add_' (step)")),
    "padded-token-count": (
        lambda cfg, dev, inputs, twin: LastTokenStep(cfg, dev, device_count=twin), False,
        "extent_mismatch", ("the step reads batch.num_actual_tokens (",)),
    "row-stride": (
        lambda cfg, dev, inputs, twin: PackedTableStep(cfg, dev, fixed=twin), True,
        "frozen_stride", ("'as_strided' (step) at field_bugs.py:", "(2,) at capture")),
    "per-call-buffer-address": (
        lambda cfg, dev, inputs, twin: DoubleBufferedStep(cfg, dev, in_place=twin), True,
        "frozen_address", ("'slice' (step) at field_bugs.py:",
                           "reads int64[256] (external) at another address than at capture")),
}


@pytest.mark.parametrize("twin", [False, True], ids=["fault", "twin"])
@pytest.mark.parametrize("hazard", list(HAZARDS))
def test_a_field_hazard_is_named_and_its_twin_passes(hazard, twin):
    make_step, engine, kind, words = HAZARDS[hazard]
    holder = {}

    def factory(cfg, dev, inputs):
        holder["step"] = make_step(cfg, dev, inputs, twin)
        return holder["step"]

    report, _ = run_check(factory,
                          before_batch=(lambda i: holder["step"].update(i)) if engine else None)
    if twin:
        passes(report)
        return
    fails_with(report, kind)
    message = next(f.message for f in report.errors if f.kind == kind)
    assert all(w in message for w in words), message
    # The named cause comes with the symptom, and with nothing unrelated: a padded count is
    # no difference from the graph's own body, and the second buffer is never freed.
    expected = {kind} if kind == "extent_mismatch" else {kind, "replay_mismatch"}
    assert expected <= report.kinds("error") <= expected | {"extent_mismatch"}, str(report)
