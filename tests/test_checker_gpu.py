"""The sanity checker catches planted faults, one test each, and passes a clean step."""

from __future__ import annotations

import pytest
import torch
from toy import ToyBuilder, ToyMetadata, ToyStep

from staticattn.arena import ArenaConfig
from staticattn.builders import make_arena
from staticattn.checks import check_graph_safety

pytestmark = pytest.mark.gpu


def _setup(builder=None):
    cfg = ArenaConfig.deepseek_v4(max_num_seqs=32, max_num_batched_tokens=256,
                                  max_model_len=8192)
    b = builder or ToyBuilder()
    arena, inputs = make_arena(cfg, [b])
    return cfg, arena, inputs, b


def _check(step_factory, builder=None):
    cfg, arena, inputs, b = _setup(builder)
    step = step_factory(cfg, arena.device, inputs)
    return check_graph_safety(arena, inputs, [b], step, sizes=[8], num_batches=20)


def test_clean_step_passes():
    report = _check(lambda cfg, dev, inputs: ToyStep(cfg, dev))
    print(report)
    assert report.ok, report.failures


def test_item_in_step_is_caught_and_named():
    class ItemStep(ToyStep):
        def __call__(self, batch, md):
            out = super().__call__(batch, md)
            if int(batch.seq_lens[0].item()) > 10**9:  # a device->host read
                out.zero_()
            return out

    report = _check(lambda cfg, dev, inputs: ItemStep(cfg, dev))
    text = "\n".join(report.failures)
    assert not report.ok and "synchronisation" in text and "item" in text, text


def test_torch_empty_in_step_is_caught_and_named():
    class EmptyStep(ToyStep):
        def __call__(self, batch, md):
            scratch = torch.empty(batch.num_actual_tokens, dtype=torch.int64,
                                  device=batch.device)
            torch.add(super().__call__(batch, md), 0, out=scratch)
            return scratch

    report = _check(lambda cfg, dev, inputs: EmptyStep(cfg, dev))
    text = "\n".join(report.failures)
    assert not report.ok and "fresh tensors" in text and "empty" in text, text


def test_data_dependent_branch_is_caught_by_capture_short_replay_long():
    class BranchStep(ToyStep):
        """Reads a host-side length (no sync!) and branches on it: the capture bakes the
        branch taken for the minimal warm-up lengths."""

        def __init__(self, cfg, dev, inputs):
            super().__init__(cfg, dev)
            self.inputs = inputs

        def __call__(self, batch, md):
            out = super().__call__(batch, md)
            if int(self.inputs.host_seq_lens[0]) > 64:
                out.add_(1)
            return out

    report = _check(lambda cfg, dev, inputs: BranchStep(cfg, dev, inputs))
    text = "\n".join(report.failures)
    assert not report.ok and "replay != eager" in text, text


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

    report = _check(lambda cfg, dev, inputs: ToyStep(cfg, dev), builder=DriftingBuilder())
    text = "\n".join(report.failures)
    assert not report.ok and "re-pointed" in text, text
