"""``replay_start`` (``docs/spec/deepseek-v41.md`` §8.1) through every public entry point of
the graph manager: ``run`` (a graph, the forced graph builds, the forced reference builds, a
manager whose eager build is the reference's), the in-place ``begin_step`` view +
``launch``, :class:`ContextGraphs` and :class:`DeviceLengthSteps`, on both kernel backends.
Every path's outputs -- each token's paged prefill SWA row and length and its request's
replay start as the batch carries it -- equal the oracle's and each other's. Graphs are
captured on CUDA and emulated elsewhere (:mod:`emulated_graphs`). Bad values are refused
with a typed error before anything is written.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from helpers.emulated_graphs import BUCKETS, emulated, graphs_for
from helpers.support import DEVICE, _t, quiet
from helpers.toy import ToyBuilder, ToyStep
from helpers.v41_swa_steps import (
    EXAMPLE_V41,
    FIXTURE_OK,
    example_step,
    oracle_step,
    replayed_steps,
    write_step_tables,
)
from hypothesis import given, settings

from staticattn.arena import ArenaConfig
from staticattn.builders import SparseSWAMetadataBuilder, make_arena
from staticattn.errors import InvalidBatchError
from staticattn.graphs import (
    ContextGraphs,
    DeviceLengthSteps,
    EagerBuild,
    EagerReason,
    GraphManager,
)
from staticattn.reference import v41_swa


class ReplayView:
    """Per token: its paged prefill SWA row and length (row ``i`` is token ``Td + i``'s) and
    its request's ``batch.replay_start``; int32 ``(T, W)``, ``(T,)``, ``(T,)`` it owns."""

    def __init__(self, cfg: ArenaConfig) -> None:
        t = cfg.max_num_batched_tokens
        self.rows = torch.full((t, cfg.sliding_window), -1, dtype=torch.int32, device=DEVICE)
        self.lens = torch.zeros(t, dtype=torch.int32, device=DEVICE)
        self.replay = torch.zeros(t, dtype=torch.int32, device=DEVICE)

    def __call__(self, batch, metadata):
        n, swa = batch.num_actual_tokens, metadata["swa"]
        self.rows.fill_(-1)
        self.lens.zero_()
        self.replay.zero_()
        if swa.prefill_swa_indices is not None:  # static: the build's kind
            r = min(swa.prefill_swa_indices.shape[0], n)
            self.rows[:r].copy_(swa.prefill_swa_indices[:r, 0])
            self.lens[:r].copy_(swa.prefill_swa_lens[:r])
        if batch.replay_start is not None:  # None in a uniform decode batch
            torch.index_select(batch.replay_start, 0, batch.token_to_req[:n],
                               out=self.replay[:n])
        return self.rows[:n], self.lens[:n], self.replay[:n]


def expected(cfg: ArenaConfig, step, rs) -> list:
    o = oracle_step(step, rs, padded=False)
    n = step.num_tokens
    exp = v41_swa.expected_mixed(cfg, o, step.num_reqs, n)
    _, owner, _ = o.tokens()
    return [exp["prefill_swa_indices"], exp["prefill_swa_lens"],
            [exp["replay_start"][owner[t]] for t in range(n)]]


def listed(outputs, n: int) -> list:
    return [o[:n].tolist() for o in outputs]


class Producer:
    """Writes the step held in its own device buffers into the input views (graph-safe:
    copies between fixed buffers); counts its calls."""

    def __init__(self, cfg: ArenaConfig) -> None:
        r, t = cfg.max_num_seqs, cfg.max_num_batched_tokens
        self.qsl = torch.zeros(r + 1, dtype=torch.int32, device=DEVICE)
        self.seq = torch.zeros(r, dtype=torch.int32, device=DEVICE)
        self.slots = torch.full((t,), -1, dtype=torch.int64, device=DEVICE)
        self.calls = 0

    def hold(self, step) -> None:
        k, nt = step.num_reqs, step.num_tokens
        qsl = np.concatenate([[0], np.cumsum(step.query_lens)]).astype(np.int32)
        self.qsl.fill_(nt)
        self.qsl[: k + 1].copy_(_t(qsl))
        self.seq.zero_()
        self.seq[:k].copy_(_t(step.seq_lens.astype(np.int32)))
        self.slots[:nt].copy_(_t(step.slot_mapping.astype(np.int64)))

    def __call__(self, inputs, num_reqs: int, num_tokens: int) -> None:
        self.calls += 1
        inputs.query_start_loc[: num_reqs + 1].copy_(self.qsl[: num_reqs + 1])
        inputs.seq_lens[:num_reqs].copy_(self.seq[:num_reqs])
        inputs.slot_mapping[:num_tokens].copy_(self.slots[:num_tokens])


@functools.cache
def _world(backend: str):
    cfg = ArenaConfig(**{**EXAMPLE_V41, "kernel_backend": backend})
    builder = SparseSWAMetadataBuilder()
    arena, inputs = make_arena(cfg, [builder])
    step = ReplayView(cfg)
    options = quiet()
    gm = GraphManager(arena, inputs, [builder], step, options)
    graphs_for(gm)
    reference = GraphManager(arena, inputs, [builder], step, quiet(
        eager_build=EagerBuild.REFERENCE))
    contexts = ContextGraphs(arena, inputs, [builder], step, contexts=[16, 64],
                             options=options)
    graphs_for(contexts)
    producer = Producer(cfg)
    device_steps = DeviceLengthSteps(gm, producer)
    if DEVICE == "cuda":
        device_steps.capture(BUCKETS)
    else:
        gm.dispatcher.add(*(emulated(device_steps.spec(size)) for size in BUCKETS))
    return cfg, inputs, gm, reference, contexts, device_steps, producer


def _in_place(manager, step, rs):
    views = manager.begin_step()
    k, t = step.num_reqs, step.num_tokens
    views.seq_lens[:k], views.slot_mapping[:t] = step.seq_lens, step.slot_mapping
    views.query_start_loc[: k + 1] = np.concatenate(([0], np.cumsum(step.query_lens)))
    views.replay_start[:k] = rs
    return manager.launch(k, t)


def test_every_entry_point_equals_the_oracle(backend):
    cfg, inputs, gm, reference, contexts, device_steps, producer = _world(backend)

    @settings(max_examples=12 if backend == "torch" else 4, suppress_health_check=FIXTURE_OK)
    @given(replayed_steps(cfg, kinds=("uniform_decode", "decode", "mixed", "prefill")))
    def check(drawn):
        step, rs = drawn
        write_step_tables(inputs, step)
        want, n = expected(cfg, step, rs), step.num_tokens
        args = (step.query_lens, step.seq_lens, step.slot_mapping)
        res = gm.run(*args, replay_start=rs)
        assert (res.mode, listed(res.outputs, n)) == ("graph", want)
        for eager in EagerBuild:
            res = gm.run(*args, replay_start=rs, eager=eager)
            assert (res.mode, listed(res.outputs, n)) == ("eager", want), eager
        res = reference.run(*args, replay_start=rs)
        assert (res.reason, listed(res.outputs, n)) == (EagerReason.NOT_CAPTURED, want)
        assert listed(_in_place(gm, step, rs), n) == want
        assert listed(contexts.run(*args, replay_start=rs).outputs, n) == want
        assert listed(_in_place(contexts, step, rs), n) == want
        producer.hold(step)
        got = device_steps.launch(step.num_reqs, n, replay_start=np.asarray(rs))
        assert listed(got, n) == want
        assert set(gm.stats.eager) <= {EagerReason.FORCED}  # every step replayed

    check()


def test_without_graphs_device_length_steps_run_the_reference_builds(backend):
    """The eager fallback of :class:`DeviceLengthSteps`: the producer's lengths read back,
    the replay starts checked in full, the reference builds on them."""
    cfg, inputs, gm, *_ = _world(backend)
    producer = Producer(cfg)
    bare = DeviceLengthSteps(GraphManager(gm.arena, inputs, gm.builders, gm.step, quiet()),
                             producer)
    step, rs = replayed_step(cfg)
    write_step_tables(inputs, step)
    producer.hold(step)
    out = bare.launch(step.num_reqs, step.num_tokens, replay_start=rs)
    assert listed(out, step.num_tokens) == expected(cfg, step, rs)
    assert bare.manager.stats.eager == {EagerReason.NOT_CAPTURED: 1}
    with pytest.raises(InvalidBatchError, match="is given for a decode"):
        bare.launch(step.num_reqs, step.num_tokens, replay_start=[3, 0, 0])


def replayed_step(cfg):
    """A decode (2 of next_n 2), a chunk continuation replaying from 4, a fresh prefill."""
    step, rs = example_step(cfg, [2, 8, 3], [9, 14, 3], [[1, 2, 3], [4, 5, 6, 7], [8]],
                            replay_start=[0, 4, 0])
    return step, np.asarray(rs)


def _written(inputs, manager) -> list:
    """What a refused step must leave as it was: the host staging, the device's replay
    starts, the manager's step counts."""
    h, stats = inputs.host, manager.stats
    return [a.copy() for a in (h.query_start_loc, h.seq_lens, h.slot_mapping, h.counts,
                               h.replay_start)] + [
        inputs.replay_start.tolist(), dict(stats.replays), dict(stats.eager)]


def _same(a: list, b: list) -> bool:
    return all(np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y
               for x, y in zip(a, b, strict=True))


BAD = {
    "negative": ([0, -1, 0], r"replay_start\[1\]=-1 is negative"),
    "past the context": ([0, 7, 0], r"replay_start\[1\]=7 is outside \[0, seq_lens - "
                         r"query_lens = 6\]"),
    "for a decode": ([1, 4, 0], r"replay_start\[0\]=1 is given for a decode"),
    "one short": ([0, 4], "must be 3 ints"),
    "not ints": ([0.0, 4.0, 0.0], "must be 3 ints"),
}


@pytest.mark.parametrize("entry", ["run", "run reference", "launch", "context graphs",
                                   "device lengths"])
@pytest.mark.parametrize("bad", sorted(BAD))
def test_bad_replay_starts_are_refused_before_anything_is_written(entry, bad):
    cfg, inputs, gm, reference, contexts, device_steps, producer = _world("torch")
    step, _ = replayed_step(cfg)
    write_step_tables(inputs, step)
    rs, match = BAD[bad]
    args = (step.query_lens, step.seq_lens, step.slot_mapping)
    if entry == "device lengths":
        if bad in ("past the context", "for a decode"):
            pytest.skip("the lengths are the device's: the contract, not a host check")
        runs = lambda: (producer.calls, dict(gm.stats.replays), dict(gm.stats.eager))
        calls, before = runs(), _written(inputs, gm)
        with pytest.raises(InvalidBatchError, match=match):
            device_steps.launch(step.num_reqs, step.num_tokens, replay_start=rs)
        assert runs() == calls
        assert _same(_written(inputs, gm), before)
        return
    if entry == "launch":
        views = gm.begin_step()
        if bad in ("one short", "not ints"):
            pytest.skip("the view holds one int32 per request")
        k, t = step.num_reqs, step.num_tokens
        views.seq_lens[:k], views.slot_mapping[:t] = step.seq_lens, step.slot_mapping
        views.query_start_loc[: k + 1] = np.concatenate(([0], np.cumsum(step.query_lens)))
        views.replay_start[:k] = rs
        before = _written(inputs, gm)
        with pytest.raises(InvalidBatchError, match=match):
            gm.launch(k, t)
        assert _same(_written(inputs, gm), before)
        views.replay_start[:k] = 0
        return
    manager = {"run": gm, "run reference": reference, "context graphs": contexts}[entry]
    before = _written(inputs, manager)
    with pytest.raises(InvalidBatchError, match=match):
        manager.run(*args, replay_start=rs)
    assert _same(_written(inputs, manager), before)


def test_an_architecture_without_bounded_replay_takes_none():
    """V4: ``run`` and the device-length steps refuse any ``replay_start`` (even 0s); the
    in-place views have none to write."""
    v4 = ArenaConfig.deepseek_v4(device=DEVICE, max_num_seqs=4, max_model_len=256,
                                 max_num_batched_tokens=32)
    builder = ToyBuilder()
    arena, inputs = make_arena(v4, [builder])
    gm = GraphManager(arena, inputs, [builder], ToyStep(v4, arena.device),
                      quiet())
    assert gm.begin_step().replay_start is None
    for rs in ([0], [3]):
        with pytest.raises(InvalidBatchError, match="has no bounded replay: pass None"):
            gm.run([6], [9], np.arange(6), replay_start=rs)
        with pytest.raises(InvalidBatchError, match="has no bounded replay: pass None"):
            DeviceLengthSteps(gm, lambda *a: None).launch(1, 6, replay_start=rs)
    assert gm.stats.eager_total == 0
    gm.run([6], [9], np.arange(6))
