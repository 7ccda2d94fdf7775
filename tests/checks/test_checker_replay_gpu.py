"""The sanity checker on the GPU, faults seen only across steps or graphs: stale pointers,
staging races, random numbers, pool reuse between graphs, work on the wrong stream, a
collective on the wrong stream. Each planted fault fails; its twin passes."""

from __future__ import annotations

import time

import pytest
import torch
from helpers.checker_steps import (
    NoisyStep,
    ScaledStep,
    ScratchStep,
    SideStreamStep,
    fails_with,
    passes,
    run_check,
)
from helpers.toy import ToyStep

from staticattn.kernels.staging.stage_inputs import COUNT_REQS

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("recreate", [True, False], ids=["recreated", "in-place"])
def test_tensor_recreated_between_steps_is_a_stale_pointer(recreate):
    holder = {}

    def factory(cfg, dev, inputs):
        holder["step"] = ScaledStep(cfg, dev)
        return holder["step"]

    report, _ = run_check(
        factory, before_batch=lambda i: holder["step"].update(i, recreate=recreate))
    if recreate:
        fails_with(report, "stale_pointer")
        assert "replay_mismatch" in report.kinds("error")
    else:
        passes(report)


def _racing_writer(inputs, seq_lens, slot_mapping):
    """An engine's staging writer that forgets to wait for the in-flight replay."""
    host, k = inputs.host, len(seq_lens)
    host.seq_lens[:k] = seq_lens
    host.slot_mapping[: len(slot_mapping)] = slot_mapping
    host.counts[COUNT_REQS] = k


def _starved_racing_writer(inputs, seq_lens, slot_mapping):
    """The same writer on a host so loaded that it writes only after the probe's first
    hold (~20 ms) has ended: the probe retries with a longer hold and still sees it."""
    time.sleep(0.03)
    _racing_writer(inputs, seq_lens, slot_mapping)


def _waiting_writer(inputs, seq_lens, slot_mapping):
    inputs.wait_staging_free()
    _racing_writer(inputs, seq_lens, slot_mapping)


@pytest.mark.parametrize("writer, racy", [(_racing_writer, True),
                                          (_starved_racing_writer, True),
                                          (_waiting_writer, False)],
                         ids=["no-wait", "no-wait-starved-host", "waits"])
def test_staging_rewritten_under_an_in_flight_replay(writer, racy):
    report, _ = run_check(lambda cfg, dev, inputs: ToyStep(cfg, dev), write_staging=writer)
    if racy:
        fails_with(report, "staging_race")
    else:
        passes(report)


def _stalled_racing_writer(inputs, seq_lens, slot_mapping):
    """A racing writer whose host stalls past every hold the probe tries (20, 40, 80 ms)."""
    time.sleep(0.3)
    _racing_writer(inputs, seq_lens, slot_mapping)


def test_a_race_probe_that_cannot_tell_says_so():
    report, _ = run_check(lambda cfg, dev, inputs: ToyStep(cfg, dev),
                          write_staging=_stalled_racing_writer)
    assert "staging_race" not in report.kinds()
    assert "race_probe_inconclusive" in report.kinds("note")


def test_random_numbers_from_a_private_generator_are_an_error():
    report, _ = run_check(lambda cfg, dev, inputs: NoisyStep(cfg, dev, private=True))
    fails_with(report, "rng_generator")


def test_random_numbers_from_the_default_generator_pass_with_a_note():
    report, _ = run_check(lambda cfg, dev, inputs: NoisyStep(cfg, dev, private=False))
    passes(report, {"graph_safe_rng"})


def test_pool_memory_freed_and_reused_by_another_graph_is_an_error():
    report, _ = run_check(lambda cfg, dev, inputs: ScratchStep(cfg, dev, keep=False))
    fails_with(report, "pool_reuse")


def test_pool_memory_kept_per_graph_passes_with_a_note():
    report, _ = run_check(lambda cfg, dev, inputs: ScratchStep(cfg, dev, keep=True))
    passes(report, {"pool_allocation"})


@pytest.mark.parametrize("joined", [False, True], ids=["outside-capture", "joined"])
def test_work_on_a_side_stream(joined):
    report, _ = run_check(lambda cfg, dev, inputs: SideStreamStep(cfg, dev, joined=joined))
    if joined:
        passes(report)
    else:
        fails_with(report, "wrong_stream")


class _CollectiveStep(ToyStep):
    """All-reduces its output (world size 1: the identity) on the capturing stream, or on a
    side stream that is not part of the capture."""

    def __init__(self, cfg, dev, side: bool):
        super().__init__(cfg, dev)
        self.side = torch.cuda.Stream(dev) if side else None

    def __call__(self, batch, md):
        import torch.distributed as dist

        out = super().__call__(batch, md)
        if self.side is None:
            dist.all_reduce(out)
        else:
            with torch.cuda.stream(self.side):
                dist.all_reduce(out)
        return out


@pytest.fixture(scope="module")
def process_group(tmp_path_factory):
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_nccl_available():
        pytest.skip("torch.distributed with NCCL is not available")
    if not dist.is_initialized():
        store = tmp_path_factory.mktemp("pg") / "store"
        try:
            dist.init_process_group("nccl", init_method=f"file://{store}", rank=0,
                                    world_size=1)
        except Exception as exc:  # no NCCL runtime, sandboxed networking...
            pytest.skip(f"torch.distributed cannot be initialised here: {exc!r}")
    yield dist
    dist.destroy_process_group()


@pytest.mark.parametrize("side", [True, False], ids=["side-stream", "capture-stream"])
def test_collective_on_the_wrong_stream(process_group, side):
    report, _ = run_check(lambda cfg, dev, inputs: _CollectiveStep(cfg, dev, side=side))
    if side:
        fails_with(report, "wrong_stream")
        assert "collective" in "\n".join(report.failures)
    else:  # NCCL may allocate through the caching allocator: notes allowed
        assert report.ok and not report.errors, str(report)
        assert all(s.mismatches == 0 and s.replays == 12 for s in report.sizes)
