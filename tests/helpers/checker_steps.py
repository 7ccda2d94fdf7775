"""Planted-fault steps for the checker's GPU tests, each next to its correct twin.

Every step extends :class:`toy.ToyStep` (``out[t] = positions[t] + 2 * seq_len``, into
buffers it owns) and breaks graph safety in one way; the twin does the same work safely.
"""

from __future__ import annotations

import torch

from helpers.toy import ToyBuilder, ToyStep
from staticattn.arena import ArenaConfig
from staticattn.builders import make_arena
from staticattn.checks import check_graph_safety

#: Captured sizes (tokens) of every check: the shared pool sees three graphs.
SIZES = (4, 8, 16)


def run_check(step_factory, builder=None, sizes=SIZES, batches=12, **kwargs):
    """Check ``step_factory(cfg, device, inputs)`` on a small V4 arena with the toy builder."""
    cfg = ArenaConfig.deepseek_v4(max_num_seqs=32, max_num_batched_tokens=256,
                                  max_model_len=8192)
    b = builder or ToyBuilder()
    arena, inputs = make_arena(cfg, [b])
    step = step_factory(cfg, arena.device, inputs)
    report = check_graph_safety(arena, inputs, [b], step, sizes=list(sizes),
                                num_batches=batches, **kwargs)
    print(report)
    return report, step


def fails_with(report, kind: str) -> None:
    """The check failed, with an error of ``kind`` among its errors."""
    assert not report.ok, str(report)
    assert kind in report.kinds("error"), str(report)
    assert "FAIL" in str(report) and report.to_dict()["verdict"] == "FAIL"


def passes(report, notes: set[str] = frozenset()) -> None:
    """The check passed with exactly these kinds of notes, every batch replayed and equal."""
    assert report.ok, str(report)
    assert report.kinds("error") == set()
    assert report.kinds("note") == set(notes), str(report)
    assert str(report).splitlines()[-1].startswith("PASS")
    assert all(s.replays == 12 and s.mismatches == 0 for s in report.sizes)


class FreshOutputStep(ToyStep):
    """Returns a tensor computed inside the capture (graph pool): allowed, a note."""

    def __call__(self, batch, md):
        n = batch.num_actual_tokens
        g = md["toy"].doubled_seq_lens.index_select(0, batch.token_to_req)
        return batch.positions[:n] + g


class HostScaleStep(ToyStep):
    """Adds a host tensor (pinned or pageable) copied to the GPU inside the step; the twin
    (``on_device``) copies it once, before any capture."""

    def __init__(self, cfg, dev, *, pinned: bool, on_device: bool = False):
        super().__init__(cfg, dev)
        host = torch.full((cfg.max_num_batched_tokens,), 3, dtype=torch.int64)
        self.scale = host.pin_memory() if pinned else host
        self.device_scale = host.to(dev) if on_device else None
        self.dev = dev

    def __call__(self, batch, md):
        out = super().__call__(batch, md)
        n = batch.num_actual_tokens
        scale = (self.device_scale[:n] if self.device_scale is not None
                 else self.scale[:n].to(self.dev, non_blocking=True))
        out.add_(scale)
        return out


class ToListStep(ToyStep):
    def __call__(self, batch, md):
        out = super().__call__(batch, md)
        if max(batch.seq_lens.tolist()) > 10**9:  # a device->host read
            out.zero_()
        return out


class ItemStep(ToyStep):
    def __call__(self, batch, md):
        out = super().__call__(batch, md)
        if int(batch.seq_lens[0].item()) > 10**9:  # a device->host read
            out.zero_()
        return out


class BranchStep(ToyStep):
    """Branches in Python on a host-side length (no sync): the capture bakes the branch taken
    at the minimal warm-up lengths. The twin (``on_device``) branches on the device."""

    def __init__(self, cfg, dev, inputs, on_device: bool = False):
        super().__init__(cfg, dev)
        self.inputs, self.on_device = inputs, on_device
        self.long = torch.zeros(cfg.max_num_batched_tokens, dtype=torch.int64, device=dev)

    def __call__(self, batch, md):
        out = super().__call__(batch, md)
        n = batch.num_actual_tokens
        if self.on_device:
            long = self.long[:n]
            torch.gt(batch.seq_lens[:1].expand(n), 64, out=long)
            out.add_(long)
        elif int(self.inputs.host_seq_lens[0]) > 64:
            out.add_(1)
        return out


class SpecialisedStep(ToyStep):
    """Clamps every token's value to the longest sequence the host saw at call time: at
    capture (short warm-up lengths) that bound is baked in. The twin clamps to the static
    ``max_model_len`` * 3."""

    def __init__(self, cfg, dev, inputs, static: bool = False):
        super().__init__(cfg, dev)
        self.inputs, self.static, self.cfg = inputs, static, cfg

    def __call__(self, batch, md):
        out = super().__call__(batch, md)
        k = batch.num_reqs
        bound = (3 * self.cfg.max_model_len if self.static
                 else 3 * int(self.inputs.host_seq_lens[:k].max()))
        out.clamp_(max=bound)
        return out


class ScaledStep(ToyStep):
    """Multiplies by ``self.scale``, a device tensor the engine updates between steps: in
    place (correct) or by re-creating it (the graph keeps reading the old one)."""

    def __init__(self, cfg, dev):
        super().__init__(cfg, dev)
        self.scale = torch.full((cfg.max_num_batched_tokens,), 2, dtype=torch.int64,
                                device=dev)

    def __call__(self, batch, md):
        out = super().__call__(batch, md)
        out.mul_(self.scale[: batch.num_actual_tokens])
        return out

    def update(self, i: int, *, recreate: bool) -> None:
        if recreate:
            self.scale = torch.full_like(self.scale, i + 3)
        else:
            self.scale.fill_(i + 3)


class ArenaWritingStep(ToyStep):
    """Writes into an arena input view (positions += 0): replay equals eager, but the step
    scribbles on memory it does not own."""

    def __call__(self, batch, md):
        batch.positions.add_(0)
        return super().__call__(batch, md)


class CachedOutputStep(ToyStep):
    """Computes its output once (at the warm-up) and returns it ever after: the graph holds
    no kernel that writes it. The twin recomputes every call."""

    def __init__(self, cfg, dev, recompute: bool = False):
        super().__init__(cfg, dev)
        self.recompute, self.cached = recompute, None

    def __call__(self, batch, md):
        if self.cached is None or self.recompute:
            self.cached = super().__call__(batch, md)
        return self.cached[: batch.num_actual_tokens]


class NoisyStep(ToyStep):
    """Adds integer noise drawn on the GPU; from a private generator (not advanced by
    replay) or, in the twin, from the default CUDA generator."""

    def __init__(self, cfg, dev, private: bool):
        super().__init__(cfg, dev)
        self.noise = torch.zeros(cfg.max_num_batched_tokens, dtype=torch.int64, device=dev)
        self.gen = torch.Generator(device=dev).manual_seed(1) if private else None

    def __call__(self, batch, md):
        out = super().__call__(batch, md)
        noise = self.noise[: batch.num_actual_tokens]
        noise.random_(0, 100, generator=self.gen)
        out.add_(noise)
        return out


class ScratchStep(ToyStep):
    """Keeps a scratch buffer allocated inside the capture. The fault re-creates it at every
    capture (dropping the previous graph's, which the pool hands to the next graph); the twin
    keeps one per captured size."""

    def __init__(self, cfg, dev, keep: bool):
        super().__init__(cfg, dev)
        self.keep, self.scratch, self.kept = keep, None, {}

    def __call__(self, batch, md):
        n = batch.num_actual_tokens
        if torch.cuda.is_current_stream_capturing():
            self.scratch = None  # the previous capture's scratch goes back to the pool
            self.scratch = torch.empty(self.out.shape[0], dtype=torch.int64,
                                       device=self.out.device)
            if self.keep:
                self.kept[n] = self.scratch
        elif self.scratch is None:
            self.scratch = torch.empty_like(self.out)
        out = super().__call__(batch, md)
        self.scratch[:n].copy_(out)
        torch.add(self.scratch[:n], 0, out=out)
        return out


class SideStreamStep(ToyStep):
    """Issues work on a side stream. The fault never joins it to the capture (the work runs
    once, at capture); the twin forks from and joins the capturing stream."""

    def __init__(self, cfg, dev, joined: bool):
        super().__init__(cfg, dev)
        self.side, self.joined = torch.cuda.Stream(dev), joined

    def __call__(self, batch, md):
        out = super().__call__(batch, md)
        main = torch.cuda.current_stream()
        if self.joined:
            self.side.wait_stream(main)
        with torch.cuda.stream(self.side):
            out.mul_(1)
        if self.joined:
            main.wait_stream(self.side)
        return out
