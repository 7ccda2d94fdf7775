"""The classes of input at the edge of what the kernels and the graph table hold, each pinned
down on CPU with both kernel backends where both exist (Triton interpreted):

* requests of zero tokens through ``run()`` (every eager build) and the mixed build;
* a sequence shorter than ``next_n`` through the in-place launch: a typed error;
* the device prefill chunk plan at exactly its workspace and logits budgets, and one past;
* the padded slots of the uniform staging, over a larger step's stale values;
* a step with more requests than the request slots of the bucket its token count selects:
  a larger bucket that has them, or the eager path -- never the too-small graph.

A paged-MQA schedule of more than 256 rows is ``test_mqa_schedule.
test_more_rows_than_one_pass_of_the_kernel``.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.entry_points import enter_step, refused_unchanged
from helpers.mixed_steps import check_mixed
from helpers.support import DEVICE, _t, make_step, quiet
from helpers.toy import ToyBuilder, ToyStep, emulated_graph, toy_expected

from staticattn.arena import ArenaConfig
from staticattn.builders import IndexerMetadataBuilder, SparseSWAMetadataBuilder, make_arena
from staticattn.checks import reference_mismatch
from staticattn.graphs import EagerBuild, EagerReason, GraphKind, GraphManager, StepKey

SMALL = dict(max_num_seqs=16, max_num_batched_tokens=256, max_model_len=4096,
             num_speculative_tokens=1)


def _real_world(backend: str, **overrides):
    cfg = ArenaConfig.deepseek_v4(**{**SMALL, **overrides}, device=DEVICE,
                                  kernel_backend=backend)
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    return cfg, builders, arena, inputs


def _write_tables(inputs, step) -> None:
    inputs.block_table[: step.num_reqs].copy_(_t(step.block_table))
    inputs.swa_block_table[: step.num_reqs].copy_(_t(step.swa_block_table))


@pytest.mark.parametrize("query_lens, seq_lens", [
    ([0, 0, 0], [4096, 4096, 4096]),
    ([2, 0, 2], [300, 17, 4096]),
    ([0, 2, 0, 9], [1, 40, 4096, 9]),
])
def test_zero_token_requests_run_on_every_path(backend, query_lens, seq_lens):
    cfg, builders, arena, inputs = _real_world(backend)
    step = make_step(cfg, query_lens, seq_lens)
    check_mixed(cfg, builders, inputs, step, 16, 16)  # the bucket build against the oracle
    with GraphManager(arena, inputs, builders, lambda batch, md: None, quiet()) as gm:
        _write_tables(inputs, step)
        q, s, slots = step.query_lens, step.seq_lens, step.slot_mapping
        for eager in (None, EagerBuild.GRAPH, EagerBuild.REFERENCE):
            res = gm.run(q, s, slots, eager=eager)
            assert res.num_tokens == int(q.sum())
        assert reference_mismatch(gm, q, s, slots) is None


@pytest.mark.parametrize("path", ["run", "launch_decode", "launch_step"])
@pytest.mark.parametrize("short", [0, 1])
def test_a_sequence_shorter_than_next_n_isrefused_unchanged(path, short):
    """Its first tokens would get negative positions (and write slots of a request that does
    not own them): refused on every entry, nothing written."""
    cfg = ArenaConfig.deepseek_v4(**SMALL, device=DEVICE)
    b = ToyBuilder()
    arena, inputs = make_arena(cfg, [b])
    with GraphManager(arena, inputs, [b], ToyStep(cfg, arena.device), quiet()) as gm:
        n = cfg.next_n
        q, s = np.array([n, n]), np.array([40, short])
        slots = np.arange(2 * n)
        refused_unchanged(gm, arena, enter_step(gm, path, q, s, slots), "seq_lens[1]")
        s[1] = n  # exactly next_n: the step's tokens are the whole sequence
        out = enter_step(gm, path, q, s, slots)()
        out = out.outputs if hasattr(out, "outputs") else out
        assert out[: 2 * n].tolist() == toy_expected(q, s)


# Prefills of N = L // R keys and M queries behind one decode: R = 4 (V4's indexer), keys
# N = [200, 300], queries M = [40, 60]: one range needs 500 keys of workspace and 100 x 500
# = 50_000 logits.
_Q, _L = [2, 40, 60], [300, 800, 1200]


@pytest.mark.parametrize("workspace, logits", [
    (500, 50_000),  # exactly both budgets: one range, one chunk
    (499, 50_000),  # one key short: two ranges
    (4096, 49_999),  # one logit short: two ranges
    (4096, 12_000),  # the second request alone is over: query sub-chunks of 40
])
def test_device_chunk_plan_at_its_budgets(backend, workspace, logits):
    cfg, builders, _, inputs = _real_world(backend, max_prefill_workspace=workspace,
                                           max_logits_bytes=4 * logits)
    assert builders[0].compress_ratio == 4
    step = make_step(cfg, _Q, _L)
    check_mixed(cfg, builders, inputs, step, 16, 128)


def test_uniform_staging_pads_over_stale_values(backend):
    """The replay path stages only the real lengths and slots; the uniform staging kernel
    pads the graph's extent on the device: slot -1 (write nothing), length 0 -- never what a
    larger step left there."""
    cfg = ArenaConfig.deepseek_v4(**SMALL, device=DEVICE, kernel_backend=backend)
    _, inputs = make_arena(cfg)
    n = cfg.next_n
    inputs.stage_uniform_decode(np.full(6, 99, np.int32), np.arange(100, 100 + 6 * n))
    inputs.copy_to_device(6, 6 * n, uniform=True)
    seq, slots = np.array([7, 300], np.int32), np.array([5, -1, 70, 71])
    inputs.stage_uniform_decode(seq, slots)
    inputs.copy_to_device(6, 6 * n, uniform=True)
    assert inputs.query_start_loc[:7].tolist() == [0, n, 2 * n] + [2 * n] * 4
    assert inputs.seq_lens[:6].tolist() == [7, 300, 0, 0, 0, 0]
    assert inputs.slot_mapping[: 6 * n].tolist() == [5, -1, 70, 71] + [-1] * (4 * n)
    assert inputs.query_lens[:6].tolist() == [n, n, 0, 0, 0, 0]
    assert inputs.positions[: 2 * n].tolist() == [5, 6, 298, 299]
    assert inputs.step_counts.tolist()[:2] == [2, 2 * n]


def _toy_manager(buckets):
    cfg = ArenaConfig.deepseek_v32(max_num_seqs=16, max_num_batched_tokens=64,
                                   max_model_len=2048, device=DEVICE)
    b = ToyBuilder()
    arena, inputs = make_arena(cfg, [b])
    gm = GraphManager(arena, inputs, [b], ToyStep(cfg, arena.device), quiet())
    gm.dispatcher.add(*(emulated_graph(gm, GraphKind.MIXED, t) for t in buckets))
    return gm


@pytest.mark.parametrize("path", ["run", "launch_step"])
def test_more_requests_than_the_bucket_slots_take_a_larger_bucket_or_run_eagerly(path):
    """Six requests, three tokens: the 4-token bucket's four request slots cannot hold the
    step; the 32-token bucket (16 slots) does; without it the step runs eagerly."""
    q, s = np.array([1, 1, 1, 0, 0, 0]), np.array([10, 20, 30, 5, 5, 5])
    slots = np.arange(3)
    for buckets, mode, size in [((4, 32), "graph", 32), ((4,), "eager", None)]:
        with _toy_manager(buckets) as gm:
            replays = gm.stats.replays[GraphKind.MIXED]
            out = enter_step(gm, path, q, s, slots)()
            if path == "run":
                assert (out.mode, out.graph_size) == (mode, size)
                out = out.outputs
            assert gm.stats.replays[GraphKind.MIXED] == replays + (mode == "graph")
            assert out[:3].tolist() == toy_expected(q, s)
    with _toy_manager((4,)) as gm:  # three zero-token requests fit four slots
        res = gm.run(np.zeros(3, int), np.array([5, 6, 7]), np.zeros(0, int))
        assert (res.mode, res.graph_size, res.outputs.shape[0]) == ("graph", 4, 0)


def test_the_dispatcher_never_picks_a_bucket_short_of_requests():
    gm = _toy_manager((4, 8, 32))
    for reqs in range(1, 17):
        for tokens in range(0, 33):
            g, reason = gm.dispatcher.route(StepKey(GraphKind.MIXED, tokens, reqs, 2))
            if g is None:
                assert reason is EagerReason.TOO_LARGE
                continue
            assert g.num_reqs >= reqs and g.size >= tokens
            holding = [t for t in (4, 8, 32) if t >= tokens and min(16, t) >= reqs]
            assert g.size == min(holding)


def test_zero_token_requests_never_replay_a_decode_graph():
    """``[next_n, 0]`` is not a uniform decode step: a decode graph of two requests would
    stage two requests of ``next_n`` tokens. It runs eagerly (no bucket captured)."""
    gm = _toy_manager(())
    n = gm.config.next_n
    gm.dispatcher.add(emulated_graph(gm, GraphKind.DECODE, 2 * n))
    for dtype in (np.int64, np.uint8):
        q, s = np.array([n, 0], dtype), np.array([5, 5], dtype)
        res = gm.run(q, s, np.arange(n))
        assert res.mode == "eager" and res.outputs.tolist() == toy_expected(q, s)


def test_a_step_filling_the_bucket_slots_exactly_replays_that_bucket():
    """Four requests, four tokens: the 4-token bucket's four slots hold the step (the
    launch returns its outputs at the bucket's extent: 4 rows, not the 32-token bucket's)."""
    with _toy_manager((4, 32)) as gm:
        q, s = np.array([1, 1, 1, 1]), np.array([3, 4, 5, 6])
        out = enter_step(gm, "launch_step", q, s, np.arange(4))()
        assert out.shape[0] == 4 and out.tolist() == toy_expected(q, s)
        res = gm.run(q, s, np.arange(4))
        assert (res.mode, res.graph_size) == ("graph", 4)


@pytest.mark.parametrize("tokens", [16, 100, 256, 8192])
def test_default_buckets_rise_strictly_to_the_capacity(tokens):
    """Bucket edges: every default bucket once, the last exactly max_num_batched_tokens."""
    from staticattn.graphs.sizes import default_mixed_buckets

    cfg = ArenaConfig.deepseek_v32(max_num_seqs=16, max_num_batched_tokens=tokens,
                                   max_model_len=2048, device=DEVICE)
    buckets = default_mixed_buckets(cfg)
    assert buckets[-1] == tokens and all(a < b for a, b in zip(buckets, buckets[1:]))
