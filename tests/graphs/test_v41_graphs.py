"""DeepSeek V4.1's builders through the graph manager: every step kind, graph-first.

The default V4.1 builder list and a step that reads, per token, what those builders own --
both compressed slot mappings, the ring slots, both index-K slot mappings, both entry
counts -- and derives the c1a and c2a decode operands from top-k rows it owns. Randomized
steps of every composition go through ``GraphManager.run`` (on CPU: the eager fallback that
launches the graph builds, ``build_decode`` / ``build_mixed``), the reference eager builds
(``eager=EagerBuild.REFERENCE``) and the in-place API (``begin_step`` / ``launch``), the
block tables written in place into ``inputs.block_tables``, the prefills' replay starts
handed to ``run`` and written into the in-place view; each equals the oracle. On a
GPU the graphs are captured first and every step replays one.
"""

from __future__ import annotations

import numpy as np
import torch
from helpers.support import DEVICE, _t, quiet
from helpers.v41_steps import random_topk, v41_config, v41_steps, write_tables
from hypothesis import given, settings

from staticattn.builders import default_builders, make_arena
from staticattn.graphs import EagerBuild, GraphManager
from staticattn.reference import mixed as mixed_oracle
from staticattn.reference import v41_compressed as oracle

TYPES = ("c1a", "c2a")


class SlotsStep:
    """``out[t]`` = c1a / c2a compressed slots, c2a ring slot, c1a / c2a index-K slots, c1a /
    c2a entry counts, c1a / c2a decode-operand lengths (0 past the decode tokens); int64
    ``(T, 9)`` it owns."""

    def __init__(self, cfg, device) -> None:
        t = cfg.max_num_batched_tokens
        self.out = torch.zeros(t, 9, dtype=torch.int64, device=device)
        self.topk = {n: torch.full((t, cfg.index_topk), -1, dtype=torch.int32, device=device)
                     for n in TYPES}

    def __call__(self, batch, md) -> torch.Tensor:
        n = batch.num_actual_tokens
        kv = md["compressed"].types
        columns = (kv["c1a"].slot_mapping, kv["c2a"].slot_mapping, kv["c2a"].ring_slot_mapping,
                   md["indexer.c1a"].slot_mapping, md["indexer.c2a"].slot_mapping,
                   kv["c1a"].entry_counts, kv["c2a"].entry_counts)
        for j, column in enumerate(columns):
            self.out[:n, j].copy_(column[:n])
        rows = md["compressed"].num_decode_tokens
        for j, name in enumerate(TYPES, start=7):
            _, lens = md["compressed"].decode_topk(name, self.topk[name])
            self.out[:rows, j].copy_(lens)
            self.out[rows:n, j].fill_(0)
        return self.out[:n]


def expected(cfg, v41, topk) -> list[list[int]]:
    step = v41.step
    k, nt = step.num_reqs, step.num_tokens
    kv = oracle.compressed(cfg, v41, k, nt)
    owner, _, own = oracle.tokens(step)
    td = mixed_oracle.counts(cfg, step)[3]
    valid = [t < td and own[t] >= 0 for t in range(nt)]
    lens = [oracle.global_topk(topk[n][:nt], owner, valid,
                               v41.rows(f"{n}.compressed_kv", k),
                               cfg.block_size // oracle.RATIOS[n])[1] for n in TYPES]
    columns = [kv["c1a"]["slot_mapping"], kv["c2a"]["slot_mapping"],
               kv["c2a"]["ring_slot_mapping"], oracle.index_k_slots(cfg, v41, "c1a", k, nt),
               oracle.index_k_slots(cfg, v41, "c2a", k, nt), kv["c1a"]["entry_counts"],
               kv["c2a"]["entry_counts"], *lens]
    return [list(row) for row in zip(*columns)]


def _world(backend: str):
    cfg = v41_config("flash-n2", backend)
    builders = default_builders(cfg)
    arena, inputs = make_arena(cfg, builders)
    step = SlotsStep(cfg, arena.device)
    return cfg, arena, inputs, GraphManager(arena, inputs, builders, step,
                                             quiet()), step


def _check_every_path(cfg, inputs, gm, slots_step, v41, seed: int) -> None:
    step = v41.step
    write_tables(inputs, v41)
    r = step.num_reqs
    inputs.swa_block_table[:r].copy_(_t(step.swa_block_table))
    topk = {}
    for name in TYPES:
        rows = random_topk(cfg, v41, oracle.RATIOS[name], step.num_tokens,
                           mixed_oracle.counts(cfg, step)[3], seed)
        topk[name] = rows
        slots_step.topk[name][: len(rows)].copy_(torch.tensor(rows, dtype=torch.int32)
                                                 .reshape(len(rows), cfg.index_topk))
    want = expected(cfg, v41, topk)
    args = (step.query_lens, step.seq_lens, step.slot_mapping)
    res = gm.run(*args, replay_start=v41.replay_start)
    assert res.outputs.tolist() == want
    if DEVICE == "cuda":
        assert res.mode == "graph", res.reason
    assert gm.run(*args, replay_start=v41.replay_start,
                  eager=EagerBuild.REFERENCE).outputs.tolist() == want
    views = gm.begin_step()
    k, t = step.num_reqs, step.num_tokens
    views.seq_lens[:k], views.slot_mapping[:t] = step.seq_lens, step.slot_mapping
    views.query_start_loc[: k + 1] = np.concatenate(([0], np.cumsum(step.query_lens)))
    views.replay_start[:k] = v41.replay_start
    # A replayed graph returns its captured (padded) outputs: the step's own rows lead.
    assert gm.launch(k, t)[:t].tolist() == want


def test_every_path_equals_the_oracle(backend):
    cfg, arena, inputs, gm, slots_step = _world(backend)
    if DEVICE == "cuda":
        gm.capture()
    fingerprint = arena.fingerprint()

    @settings(max_examples=20 if backend == "torch" else 5)
    @given(v41_steps(cfg, max_seq_len=4096))
    def check(v41):
        _check_every_path(cfg, inputs, gm, slots_step, v41, v41.step.num_tokens)

    check()
    assert arena.fingerprint() == fingerprint
    gm.close()


def test_uniform_decodes_through_the_decode_path(backend):
    """Uniform decodes through ``run`` and the in-place ``launch(k)`` alike."""
    cfg, arena, inputs, gm, slots_step = _world(backend)
    if DEVICE == "cuda":
        gm.capture()

    @settings(max_examples=10 if backend == "torch" else 3)
    @given(v41_steps(cfg, kinds=("uniform_decode",)))
    def check(v41):
        _check_every_path(cfg, inputs, gm, slots_step, v41, 1)
        step = v41.step
        views = gm.begin_step()
        k = step.num_reqs
        views.seq_lens[:k], views.slot_mapping[: step.num_tokens] = (step.seq_lens,
                                                                     step.slot_mapping)
        got = gm.launch(k)[: step.num_tokens].tolist()
        assert got == gm.run(step.query_lens, step.seq_lens, step.slot_mapping).outputs.tolist()

    check()
    gm.close()
