"""The checker's bookkeeping on CPU: the capture watch (allocations, arena writes of the step,
random numbers, tensors read from outside the arena), the arena index, the step's phase
marker and the re-pointed-view comparison. The GPU-only parts (host reads, the stream
check) are covered by the GPU tests."""

from __future__ import annotations

import torch
from helpers.toy import ToyBuilder, ToyMetadata

from staticattn.arena import ArenaConfig
from staticattn.builders import make_arena
from staticattn.checks.guarded_capture import PhasedStep
from staticattn.checks.probes import stale_reads
from staticattn.checks.view_addresses import moved_views, tensors_in
from staticattn.checks.watch import ArenaIndex, CaptureWatch


def _arena():
    cfg = ArenaConfig.deepseek_v4(max_num_seqs=8, max_num_batched_tokens=32,
                                  max_model_len=1024, device="cpu")
    arena, inputs = make_arena(cfg, [ToyBuilder()])
    return arena, inputs


def test_fresh_storage_is_recorded_views_inplace_and_out_are_not():
    a = torch.arange(8)
    out = torch.empty(8, dtype=torch.int64)
    with CaptureWatch(device_type="cpu") as watch:
        torch.add(a, 1, out=out)
        a.view(2, 4)
        out.add_(1)
        fresh = a + out
        torch.empty(3, dtype=torch.int32)
    assert watch.fresh == {"add": 1, "empty": 1}, (watch.fresh, watch.ops)
    refs = {r.op: r for r in watch.allocations}
    assert refs["add"].shape == (8,) and refs["add"].dtype == "int64"
    assert refs["add"].ptr == fresh.untyped_storage().data_ptr()
    assert refs["empty"].expired()  # nothing holds the empty tensor
    assert not refs["add"].expired()
    del fresh
    assert refs["add"].expired()


def test_writes_of_the_step_into_the_arena_are_named():
    arena, inputs = _arena()
    watch = CaptureWatch(arena=ArenaIndex.of(arena), device_type="cpu")
    own = torch.zeros(4, dtype=torch.int32)
    with watch:
        inputs.seq_lens.add_(0)  # the builds may write the arena
        watch.phase = "step"
        torch.add(inputs.positions[:4], 1, out=own)  # reading it is fine
        inputs.positions.add_(0)
        torch.add(own, 1, out=arena["toy.doubled"][:4])
    assert watch.arena_writes == ["'add_' writes input.positions", "'add' writes toy.doubled"]


def test_random_numbers_record_their_generator():
    t = torch.empty(4)
    with CaptureWatch(device_type="cpu") as watch:
        t.uniform_()
        t.normal_(generator=torch.Generator().manual_seed(0))
        t.add_(1)
    assert watch.rng == [("uniform_", True), ("normal_", False)]


def test_tensors_read_from_outside_the_arena_are_tracked_until_freed():
    arena, inputs = _arena()
    weights = torch.ones(4, dtype=torch.int64)
    out = torch.zeros(4, dtype=torch.int64)
    watch = CaptureWatch(arena=ArenaIndex.of(arena), device_type="cpu")
    with watch:
        tmp = inputs.positions[:4] * 2  # fresh: pool memory, not an outside read
        torch.add(tmp, weights, out=out)
    seen = {r.op for r in watch.external.values()}
    ptrs = set(watch.external)
    assert weights.untyped_storage().data_ptr() in ptrs and out.untyped_storage().data_ptr() in ptrs
    assert tmp.untyped_storage().data_ptr() not in ptrs
    assert arena.block("device").untyped_storage().data_ptr() not in ptrs
    assert seen == {"add"}
    assert stale_reads(watch.external.values()) == []
    del weights
    stale = stale_reads(watch.external.values())
    assert len(stale) == 1 and "int64[4] from 'add'" in stale[0], stale


def test_arena_index_names_views_and_tells_storage_apart():
    arena, inputs = _arena()
    index = ArenaIndex.of(arena)
    assert index.holds(inputs.seq_lens) and index.holds(inputs.host_seq_lens)
    assert not index.holds(torch.zeros(3))
    assert index.name(inputs.seq_lens[2:4]) == "input.seq_lens"
    assert index.name(arena["toy.doubled"]) == "toy.doubled"


def test_phased_step_marks_the_step_and_restores_the_phase():
    seen = []
    watch = CaptureWatch(device_type="cpu")

    def step(batch, md):
        seen.append(watch.phase)
        raise ValueError("boom")

    phased = PhasedStep(step)
    phased.watch = watch
    try:
        phased(None, {})
    except ValueError:
        pass
    assert seen == ["step"] and watch.phase == "build"


def test_moved_views_names_every_re_pointed_field():
    base = torch.zeros(10, dtype=torch.int32)
    first = {"toy": ToyMetadata(base[:4]), "other": [base[4:6], None]}
    assert moved_views(first, {"toy": ToyMetadata(base[:4]), "other": [base[4:6], None]}) == []
    second = {"toy": ToyMetadata(base[1:5]), "other": [base[4:7], None]}
    assert moved_views(first, second) == ["other[0]", "toy.doubled_seq_lens"]
    assert moved_views(first, {"toy": ToyMetadata(base[:4])}) == ["other[0]"]
    assert [p for p, _ in tensors_in(first)] == [".toy.doubled_seq_lens", ".other[0]"]


def test_only_views_a_build_keeps_in_place_can_be_repointed():
    """A library's plan tensors are fresh in every eager build (they live in the graph pool
    once captured): only the tensors ``held`` names are compared."""
    block = torch.zeros(64, dtype=torch.int32)
    first = {"lens": block[:8], "plan": {"meta": torch.zeros(4)}}
    same = {"lens": block[:8], "plan": {"meta": torch.zeros(4)}}
    moved = {"lens": block[8:16], "plan": {"meta": None}}

    def held(t):
        return t.untyped_storage().data_ptr() == block.untyped_storage().data_ptr()

    assert moved_views(first, same) == ["plan.meta"]
    assert moved_views(first, same, held=held) == []
    assert moved_views(first, moved, held=held) == ["lens"]
