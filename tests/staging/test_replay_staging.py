"""Bounded replay's per-request input (``docs/spec/deepseek-v41.md`` §8.1): declared only
for architectures with bounded replay, staged after the split so that only prefill
requests carry it (whichever staging found the split), checked before anything is
written. Through the graph manager's entry points: ``tests/graphs/test_v41_replay_start.py``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.support import DEVICE
from helpers.v41_swa_steps import EXAMPLE_V41

from staticattn.arena import ArenaConfig
from staticattn.builders import Batch, make_arena
from staticattn.errors import InvalidBatchError
from staticattn.model import ARCHITECTURES


def _inputs(backend="torch", **overrides):
    cfg = ArenaConfig(**{**EXAMPLE_V41, "kernel_backend": backend, **overrides})
    arena, inputs = make_arena(cfg, [])
    return cfg, arena, inputs


def test_declared_by_the_architecture_row():
    assert [n for n, a in ARCHITECTURES.items() if a.bounded_replay] == ["deepseek_v41"]
    _, arena, inputs = _inputs()
    assert {"input.replay_start", "staging.replay_start"} <= set(arena.names())
    assert inputs.host.replay_start is not None
    v4 = ArenaConfig.deepseek_v4(device=DEVICE, max_num_seqs=4, max_model_len=256,
                                 max_num_batched_tokens=32)
    arena, inputs = make_arena(v4, [])
    assert not any("replay_start" in n for n in arena.names())
    assert inputs.replay_start is None and inputs.host.replay_start is None


def test_only_prefill_requests_carry_it(backend):
    """Decodes (a verify of 2 <= next_n) and padded requests read 0 whatever was staged
    (the checks refuse a decode's start; unchecked, the device drops it)."""
    _, _, inputs = _inputs(backend)
    q, lens = np.array([2, 4, 6]), np.array([10, 9, 20])
    with pytest.raises(InvalidBatchError, match=r"replay_start\[0\]=5 is given for a decode"):
        inputs.stage(q, lens, np.arange(12), replay_start=np.array([5, 3, 7]))
    counts = inputs.stage(q, lens, np.arange(12), num_reqs_padded=4,
                          replay_start=np.array([5, 3, 7]), checked=True)
    inputs.copy_to_device(4, 12)
    batch = Batch.from_staged(inputs, counts)
    assert batch.replay_start.tolist() == [0, 3, 7, 0]
    assert inputs.step_counts.tolist()[2] == 1  # D = 1
    # A token bucket: the spare request slots read 0 too.
    inputs.stage(q, lens, np.arange(12), replay_start=np.array([5, 3, 7]), checked=True)
    inputs.copy_to_device(4, 16)
    assert Batch.for_mixed_capture(inputs, 4, 16).replay_start.tolist() == [0, 3, 7, 0]
    # No replay_start: nothing replays.
    inputs.stage(q, lens, np.arange(12))
    inputs.copy_to_device(3, 12)
    assert inputs.replay_start[:3].tolist() == [0, 0, 0]


def test_uniform_steps_replay_nothing_device_started_ones_read_the_host(backend):
    _, _, inputs = _inputs(backend)
    inputs.stage(np.array([5, 6]), np.array([10, 20]), np.arange(11),
                 replay_start=np.array([4, 9]))
    inputs.copy_to_device(2, 11)
    assert inputs.replay_start[:2].tolist() == [4, 9]
    inputs.stage_uniform_decode(np.array([10, 20]), np.arange(4))
    inputs.copy_to_device(2, 4, uniform=True)
    assert Batch.for_decode_capture(inputs, 2).replay_start is None
    # A step whose query starts a kernel wrote on the device: the host's starts (none
    # given: 0s), for the prefills of the device's split only.
    inputs.query_start_loc[:3] = torch.tensor([0, 1, 7], dtype=torch.int32)
    inputs.seq_lens[:2] = torch.tensor([10, 20], dtype=torch.int32)
    inputs.stage_device_step(2)
    inputs.copy_to_device(2, 7, device_starts=True)
    assert inputs.replay_start[:2].tolist() == [0, 0]
    inputs.stage_device_step(2, np.array([3, 9]))
    inputs.copy_to_device(2, 7, device_starts=True)
    assert inputs.replay_start[:2].tolist() == [0, 9]


@pytest.mark.parametrize("rs, match", [
    ([0, 7], r"replay_start\[1\]=7 is outside \[0, seq_lens - query_lens = 3\]"),
    ([-1, 0], r"replay_start\[0\]=-1"),
    ([0], "must be 2 ints"),
    ([0.5, 0.0], "must be 2 ints"),
    ([1, 0], r"replay_start\[0\]=1 is given for a decode \(query_lens\[0\]=2 <= "
             r"decode_threshold=2"),
])
def test_bad_replay_starts_are_refused_before_any_write(rs, match):
    _, _, inputs = _inputs()
    before = inputs.host.replay_start.copy(), inputs.host.seq_lens.copy()
    with pytest.raises(InvalidBatchError, match=match):
        inputs.stage(np.array([2, 6]), np.array([9, 9]), np.arange(8), replay_start=np.array(rs))
    assert (inputs.host.replay_start == before[0]).all()
    assert (inputs.host.seq_lens == before[1]).all()


@pytest.mark.parametrize("rs", [[2], [0]])
def test_an_architecture_without_bounded_replay_refuses_starts(rs):
    v4 = ArenaConfig.deepseek_v4(device=DEVICE, max_num_seqs=4, max_model_len=256,
                                 max_num_batched_tokens=32)
    _, inputs = make_arena(v4, [])
    with pytest.raises(InvalidBatchError, match="has no bounded replay: pass None"):
        inputs.stage(np.array([6]), np.array([9]), np.arange(6), replay_start=np.array(rs))
    inputs.stage(np.array([6]), np.array([9]), np.arange(6))
