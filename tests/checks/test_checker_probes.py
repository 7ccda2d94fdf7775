"""The checker's replay probes on CPU, with plain functions standing in for a replay:
outputs a replay never rewrites, pool memory freed and reused by another graph."""

from __future__ import annotations

import pytest
import torch

from staticattn.checks.probes import freed_and_reused, sentinels, unwritten_mask, unwritten_outputs
from staticattn.checks.watch import TensorRef


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32, torch.bfloat16,
                                   torch.bool])
def test_sentinels_differ_in_every_dtype(dtype):
    a, b = sentinels(dtype)
    t = torch.empty(2, dtype=dtype)
    t[0], t[1] = a, b
    assert t[0] != t[1]


def test_unwritten_mask_marks_elements_that_kept_both_sentinels():
    first = torch.tensor([1, 7, 1, 1])
    second = torch.tensor([2, 7, 1, 2])
    assert unwritten_mask(first, second).tolist() == [True, False, False, True]


def test_a_replay_that_writes_every_row_leaves_nothing_unwritten():
    out = {"a": torch.zeros(6, 2, dtype=torch.int64), "b": torch.zeros(6, dtype=torch.bool)}

    def replay():
        out["a"][:4] = torch.arange(8).view(4, 2)
        out["b"][:4] = torch.tensor([True, False, True, False])

    assert unwritten_outputs(out, 4, replay) == []
    assert out["a"][:4].flatten().tolist() == list(range(8))  # left as the replay wrote it


def test_random_outputs_are_written_the_same_by_both_replays():
    """An output drawn from the default generator (a mask, accepted counts) is rewritten by
    every replay: both replays start from one seed, and the caller's state comes back."""
    out = torch.zeros(64, dtype=torch.bool)

    def replay():
        out.copy_(torch.rand(64) < 0.5)

    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    assert unwritten_outputs(out, 64, replay) == []
    assert torch.equal(torch.random.get_rng_state(), before)


def test_rows_a_replay_skips_are_reported_per_output():
    out = (torch.zeros(6, dtype=torch.float32), torch.zeros(6, 3, dtype=torch.int32))

    def replay():  # writes rows 0..2 of the first output only
        out[0][:3] = 5.0

    found = unwritten_outputs(out, 4, replay)
    assert len(found) == 2, found
    assert found[0].startswith("output 0 (float32[6]): 1 of 4 elements"), found
    assert found[1].startswith("output 1 (int32[6, 3]): 12 of 12 elements"), found


def _ref(t: torch.Tensor, op: str = "empty") -> TensorRef:
    return TensorRef.of(t, op, "step")


def test_freed_escaped_memory_reused_by_a_later_graph_is_reported():
    live = torch.zeros(4)
    gone = torch.zeros(4)
    gone_ref = _ref(gone)
    del gone
    assert gone_ref.expired()
    later = TensorRef("empty", "step", (4,), "float32", gone_ref.ptr + 4, 4, _ref(live).ref)
    elsewhere = TensorRef("empty", "step", (4,), "float32", gone_ref.ptr + gone_ref.nbytes, 4,
                          _ref(live).ref)
    escaped = {16: [gone_ref, _ref(live)], 8: [], 4: []}
    found = freed_and_reused(escaped, {16: [gone_ref], 8: [elsewhere], 4: [later]})
    assert [a for a, _ in found] == [16] and "graph of 4 tokens" in found[0][1]
    assert freed_and_reused(escaped, {8: [elsewhere]}) == []  # freed, but not overlapped
    assert freed_and_reused({16: [_ref(live)]}, {8: [TensorRef.of(live, "add", "step")]}) == []
    # Only graphs captured after the one that let the memory go count as reusing it.
    assert [a for a, _ in freed_and_reused({8: [gone_ref], 16: []}, {16: [later]})] == [8]
    assert freed_and_reused({16: [], 8: [gone_ref]}, {16: [later]}) == []
