"""DeepSeek V4.1's decoder-side replay sub-batch (``docs/spec/deepseek-v41.md`` §8.2) and DSpark
draft rows (§7.5) inside the graph manager's graphs.

* The replay sub-batch builder rides with the SWA builder in every decode graph and token
  bucket: a step reads its rows, positions, slots, requests, ``kv_start`` and the replay
  layers' SWA lengths. Randomized steps with replay starts replay a graph (captured on CUDA,
  emulated elsewhere, :mod:`emulated_graphs`) and equal the eager reference builds
  (``build``) and the oracle, ``staticattn.reference.v41_decoder_replay``.
* The draft builder alone makes a draft step's manager: decode graphs only (a draft step is
  uniform), its ``build_decode`` captured; replays equal the eager build and the oracle.

``gpu`` tests capture for real and check the graphs hold the builds' kernels.
"""

from __future__ import annotations

import functools

import pytest
import torch
from helpers import v41_swa_steps as steps
from helpers.emulated_graphs import graphs_for
from helpers.support import DEVICE, quiet
from hypothesis import given, settings

from staticattn.arena import ArenaConfig
from staticattn.builders import (
    DecoderReplayBuilder,
    DraftSWAMetadataBuilder,
    SparseSWAMetadataBuilder,
    make_arena,
)
from staticattn.builders.swa.draft import draft_swa_width
from staticattn.graphs import EagerBuild, GraphManager
from staticattn.reference import v41_decoder_replay as v41_replay
from staticattn.reference import v41_swa

gpu = pytest.mark.gpu


class SubBatchStep:
    """Columns of int64 ``(T, 7)`` it owns: the sub-batch's rows, positions, slots and
    requests per sub-batch token; ``kv_start`` per request; the replay layers' decode SWA
    lengths per sub-batch decode token and paged prefill lengths per prefill row. 0 past
    each view."""

    def __init__(self, cfg: ArenaConfig) -> None:
        self.out = torch.zeros(cfg.max_num_batched_tokens, 7, dtype=torch.int64, device=DEVICE)

    def __call__(self, batch, metadata):
        m, out = metadata["replay"], self.out
        out.zero_()
        sub, swa = m.batch, m.swa
        columns = [m.rows, sub.positions, sub.slot_mapping, sub.token_to_req, m.kv_start,
                   swa.decode_swa_lens, swa.prefill_swa_lens]
        for j, column in enumerate(columns):
            if column is not None:  # static: the build's kind
                n = min(column.shape[0], out.shape[0])
                out[:n, j].copy_(column[:n])
        return out[: batch.num_actual_tokens]


def expected_sub_batch(cfg, step, rs) -> tuple[list[list[int]], list[int]]:
    """Per column, the values of its real prefix (the oracle's), and those prefixes' ends."""
    o = steps.oracle_step(step, rs, padded=False)
    exp = v41_replay.sub_batch(cfg, o, step.num_reqs, step.num_tokens)
    k, total, d, td = exp["step_counts"]
    _, decode_lens = v41_swa.decode_rows(cfg, exp["step"], td)
    prefill = v41_swa.expected_eager(cfg, exp["step"]).get("prefill_swa_lens", [])
    columns = [exp["rows"][:total], exp["positions"][:total], exp["slot_mapping"][:total],
               exp["token_to_req"][:total], exp["kv_start"][:k], decode_lens, prefill]
    return columns, [len(c) for c in columns]


def prefixes(outputs: torch.Tensor, ends: list[int]) -> list[list[int]]:
    return [outputs[:n, j].tolist() for j, n in enumerate(ends)]


@functools.cache
def _replay_world(backend: str):
    cfg = ArenaConfig(**{**steps.EXAMPLE_V41, "kernel_backend": backend})
    builders = [SparseSWAMetadataBuilder(), DecoderReplayBuilder(first_layer=False)]
    arena, inputs = make_arena(cfg, builders)
    gm = GraphManager(arena, inputs, builders, SubBatchStep(cfg), quiet())
    graphs_for(gm)
    return cfg, inputs, gm


def _check_replay_step(cfg, inputs, gm, step, rs) -> None:
    steps.write_step_tables(inputs, step)
    want, ends = expected_sub_batch(cfg, step, rs)
    args = (step.query_lens, step.seq_lens, step.slot_mapping)
    res = gm.run(*args, replay_start=rs)
    assert res.mode == "graph" and prefixes(res.outputs, ends) == want
    eager = gm.run(*args, replay_start=rs, eager=EagerBuild.REFERENCE)
    assert prefixes(eager.outputs, ends) == want


def test_the_replay_sub_batch_replays_as_built_eagerly(backend):
    cfg, inputs, gm = _replay_world(backend)

    @settings(max_examples=12 if backend == "torch" else 4, suppress_health_check=steps.FIXTURE_OK)
    @given(steps.replayed_steps(cfg, kinds=("uniform_decode", "decode", "mixed", "prefill")))
    def check(drawn):
        step, rs = drawn
        _check_replay_step(cfg, inputs, gm, step, rs)

    check()


class DraftStep:
    """The draft rows, lengths and validity, int32 ``(T, Wd + 2)`` it owns."""

    def __init__(self, cfg: ArenaConfig) -> None:
        self.width = draft_swa_width(cfg)
        self.out = torch.zeros(cfg.max_num_batched_tokens, self.width + 2, dtype=torch.int32,
                               device=DEVICE)

    def __call__(self, batch, metadata):
        m, n = metadata["swa_draft"], batch.num_actual_tokens
        self.out[:n, : self.width].copy_(m.swa_indices[:n, 0])
        self.out[:n, self.width].copy_(m.swa_lens[:n])
        self.out[:n, self.width + 1].copy_(m.is_valid_token[:n])
        return self.out[:n]


@functools.cache
def _draft_world(backend: str):
    cfg = ArenaConfig(**{**steps.EXAMPLE_V41, "kernel_backend": backend})
    builder = DraftSWAMetadataBuilder()
    arena, inputs = make_arena(cfg, [builder])
    gm = GraphManager(arena, inputs, [builder], DraftStep(cfg), quiet())
    assert gm.eager_build is EagerBuild.REFERENCE  # no build_mixed: a draft step is uniform
    graphs_for(gm, buckets=())
    return cfg, inputs, gm


def _check_draft_step(cfg, inputs, gm, step) -> None:
    steps.write_step_tables(inputs, step)
    n = step.num_tokens
    want = v41_replay.draft_rows(cfg, steps.oracle_step(step, [0] * step.num_reqs, padded=False),
                                 draft_swa_width(cfg), n)
    expected = [row + [length, int(valid)] for row, length, valid in zip(
        want["rows"], want["lens"], want["is_valid_token"])]
    args = (step.query_lens, step.seq_lens, step.slot_mapping)
    res = gm.run(*args)
    assert (res.mode, res.outputs.tolist()) == ("graph", expected)
    assert gm.run(*args, eager=EagerBuild.REFERENCE).outputs.tolist() == expected
    views = gm.begin_step()
    k = step.num_reqs
    views.seq_lens[:k], views.slot_mapping[:n] = step.seq_lens, step.slot_mapping
    assert gm.launch(k)[:n].tolist() == expected


def test_the_draft_step_replays_as_built_eagerly(backend):
    cfg, inputs, gm = _draft_world(backend)

    @settings(max_examples=12 if backend == "torch" else 4, suppress_health_check=steps.FIXTURE_OK)
    @given(steps.replayed_steps(cfg, kinds=("uniform_decode",)))
    def check(drawn):
        _check_draft_step(cfg, inputs, gm, drawn[0])

    check()


def _kernels(graph) -> int:
    return (graph.nodes or {}).get("kernel", 0)


@gpu
def test_captured_graphs_hold_the_replay_and_draft_builds():
    """On CUDA: every graph is a real capture holding kernels, and replays after new inputs
    follow them (worked steps: §11 case 5's shape, a replay from 11; draft blocks)."""
    for backend in ("torch", "triton"):
        cfg, inputs, gm = _replay_world(backend)
        for g in [*gm.graphs.values(), *gm.mixed_graphs.values()]:
            assert g.how != "eagerly" and _kernels(g) > 0
        for q, lens, rs in (([1, 9], [10, 13], [0, 4]), ([2, 5], [10, 20], [0, 11])):
            step, rs = steps.example_step(cfg, q, lens, [[1, 7, 8], [1, 2, 9, 11, 12, 13]],
                                    replay_start=rs)
            _check_replay_step(cfg, inputs, gm, step, rs)
        cfg, inputs, draft = _draft_world(backend)
        assert all(g.how != "eagerly" and _kernels(g) > 0 for g in draft.graphs.values())
        for lens in ([10, 3], [30, 17]):
            step, _ = steps.example_step(cfg, [2, 2], lens, [[1, 5, 7, 9, 2, 3, 4, 6], [6, 8, 10]])
            _check_draft_step(cfg, inputs, draft, step)
