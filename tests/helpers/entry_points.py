"""Steps handed through each entry point of a graph manager, and the check that a refused
step changed nothing (shared by the pool-bound and input-edge tests)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from staticattn.errors import InvalidBatchError


def enter_step(gm, path: str, q, s, slots):
    """The step's entry: ``run``, or the pinned views written now and ``launch`` (the
    engine's own writes come before the launch that checks them)."""
    if path == "run":
        return lambda: gm.run(q, s, slots)
    host = gm.begin_step()
    k, t = len(q), int(q.sum())
    host.seq_lens[:k], host.slot_mapping[:t] = s, slots
    if path == "launch_decode":
        return lambda: gm.launch(k)
    host.query_start_loc[: k + 1] = np.concatenate([[0], np.cumsum(q)])
    return lambda: gm.launch(k, t)


def refused_unchanged(gm, arena, fn, *fragments) -> None:
    """``fn`` raises a typed error naming ``fragments``; no buffer changed, no step ran."""
    before = {name: arena[name].clone() for name in arena.names()}
    steps = (gm.stats.eager_total, gm.stats.replays_total)
    with pytest.raises(InvalidBatchError) as info:
        fn()
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
    for name, was in before.items():
        assert torch.equal(arena[name], was), f"{name} changed after a refused step"
    assert (gm.stats.eager_total, gm.stats.replays_total) == steps
