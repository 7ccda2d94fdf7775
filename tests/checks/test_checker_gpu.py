"""The sanity checker on the GPU: each planted fault (tests/helpers/checker_steps.py) is an error
that fails the check, and its correct twin passes, with notes only."""

from __future__ import annotations

import pytest
import torch
from helpers.checker_steps import (
    ArenaWritingStep,
    BranchStep,
    CachedOutputStep,
    FreshOutputStep,
    HostScaleStep,
    ItemStep,
    SpecialisedStep,
    ToListStep,
    fails_with,
    passes,
    run_check,
)
from helpers.toy import ToyBuilder, ToyMetadata, ToyStep

pytestmark = pytest.mark.gpu


def test_clean_step_passes_without_notes():
    report, _ = run_check(lambda cfg, dev, inputs: ToyStep(cfg, dev))
    passes(report)


def test_fresh_output_computed_in_capture_is_a_note_and_passes():
    report, _ = run_check(lambda cfg, dev, inputs: FreshOutputStep(cfg, dev))
    passes(report, {"pool_allocation"})
    note = next(f for f in report.notes if f.kind == "pool_allocation")
    assert "graph pool" in note.message and "(step)" in note.message, note.message


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "pageable"])
def test_host_tensor_read_at_capture_is_an_error(pinned):
    report, _ = run_check(lambda cfg, dev, inputs: HostScaleStep(cfg, dev, pinned=pinned))
    fails_with(report, "host_read")
    text = "\n".join(report.failures)
    assert ("pinned" if pinned else "pageable") in text, text


def test_host_tensor_twin_copied_before_capture_passes():
    report, _ = run_check(
        lambda cfg, dev, inputs: HostScaleStep(cfg, dev, pinned=True, on_device=True))
    passes(report)


# .item() reads one value (a sync); .tolist() copies device memory to the host first, which
# the capture refuses outright: a host read, and the capture failure names the call.
@pytest.mark.parametrize("step_cls, spelled, kind",
                         [(ItemStep, "item", "sync"), (ToListStep, "tolist", "host_read")],
                         ids=["item", "tolist"])
def test_item_and_tolist_in_capture_are_errors_named(step_cls, spelled, kind):
    report, _ = run_check(lambda cfg, dev, inputs: step_cls(cfg, dev))
    fails_with(report, kind)
    text = "\n".join(report.failures)
    assert "synchronisation" in text and spelled in text, text


def test_python_branch_on_data_is_caught_by_replay_vs_eager():
    report, _ = run_check(lambda cfg, dev, inputs: BranchStep(cfg, dev, inputs))
    fails_with(report, "replay_mismatch")


def test_branch_on_the_device_passes():
    report, _ = run_check(lambda cfg, dev, inputs: BranchStep(cfg, dev, inputs, on_device=True))
    passes(report)


def test_capture_short_replay_long_specialisation_is_caught():
    report, _ = run_check(lambda cfg, dev, inputs: SpecialisedStep(cfg, dev, inputs))
    fails_with(report, "replay_mismatch")
    assert all(s.mismatches > 0 for s in report.sizes), str(report)


def test_static_bound_twin_passes():
    report, _ = run_check(lambda cfg, dev, inputs: SpecialisedStep(cfg, dev, inputs, static=True))
    passes(report)


def test_writing_into_an_arena_input_view_is_an_error():
    report, _ = run_check(lambda cfg, dev, inputs: ArenaWritingStep(cfg, dev))
    fails_with(report, "arena_write")
    assert "input.positions" in "\n".join(report.failures)
    assert all(s.mismatches == 0 for s in report.sizes)  # only the watch can tell


def test_output_never_rewritten_by_replay_is_an_error():
    report, _ = run_check(lambda cfg, dev, inputs: CachedOutputStep(cfg, dev))
    fails_with(report, "output_not_rewritten")


def test_output_recomputed_every_call_passes():
    report, _ = run_check(lambda cfg, dev, inputs: CachedOutputStep(cfg, dev, recompute=True))
    passes(report)


def test_repointed_buffer_is_caught():
    class DriftingBuilder(ToyBuilder):
        """Returns a view that moves by one element every call: a re-pointed buffer."""

        calls = 0

        def build_decode(self, batch):
            DriftingBuilder.calls += 1
            off = DriftingBuilder.calls % 2
            out = self.doubled[off : off + batch.num_reqs]
            torch.add(batch.seq_lens, batch.seq_lens, out=out)
            return ToyMetadata(out)

    report, _ = run_check(lambda cfg, dev, inputs: ToyStep(cfg, dev), builder=DriftingBuilder())
    fails_with(report, "repointed")
