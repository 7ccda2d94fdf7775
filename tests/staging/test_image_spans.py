"""Image spans of DeepSeek V4's vision variant (``vllm-0.33-extras.md`` §3): the worked
examples B, B' and B'' exactly, eager and token-bucket builds against the oracle over drawn
steps and spans (both backends), the combined rows (§5.1) with spans, the preset and its
capacities, and every bad span refused with nothing written."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.support import DEVICE, host_steps, quiet, span_fault
from helpers.v41_swa_steps import (
    FIXTURE_OK,
    example_step,
    oracle_step,
    stage_bucket,
    stage_eager,
    write_step_tables,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from staticattn.arena import ArenaConfig
from staticattn.builders import Batch, make_arena
from staticattn.builders.swa.builder import SparseSWAMetadataBuilder
from staticattn.errors import ArenaError, CapacityError, ConfigError, InvalidBatchError
from staticattn.graphs import EagerBuild, GraphManager
from staticattn.reference import v41_rows
from staticattn.reference import v41_swa as oracle
from staticattn.reference.step import HostStep
from staticattn.validation.image_spans import check_image_spans, spans_pass

#: Example B's geometry: W = 4, mit = 3, SWA pages of 4, one draft token (threshold 2).
VISION = dict(device=DEVICE, architecture="deepseek_v4", compress_ratios=(1, 4), block_size=8,
              sliding_window=4, swa_block_size=4, index_topk=4, max_model_len=64,
              max_num_seqs=4, max_num_batched_tokens=32, num_speculative_tokens=1,
              max_image_tokens=3, max_image_spans=8)
SPANS_B = {0: [(2, 5)], 1: [(1, 3), (9, 12)], 2: [(2, 4), (7, 10)]}
ROWS_B = [
    [25, 26, 27, 44, -1, -1, -1], [26, 27, 44, 45, 46, 47, 52], [27, 44, 45, 46, 47, 52, -1],
    [44, 45, 46, 47, 52, -1, -1], [45, 46, 47, 52, -1, -1, -1], [46, 47, 52, 53, -1, -1, -1],
    [8, -1, -1, -1, -1, -1, -1], [8, 9, -1, -1, -1, -1, -1], [8, 9, 10, 11, 28, -1, -1],
    [8, 9, 10, 11, 28, -1, -1], [9, 10, 11, 28, -1, -1, -1], [10, 11, 28, 29, -1, -1, -1],
    [11, 28, 29, 30, -1, -1, -1], [28, 29, 30, 31, 32, 33, 34], [29, 30, 31, 32, 33, 34, -1],
    [30, 31, 32, 33, 34, -1, -1], [31, 32, 33, 34, -1, -1, -1], [32, 33, 34, 35, -1, -1, -1],
]
LENS_B = [4, 7, 6, 5, 4, 4, 1, 2, 5, 5, 4, 4, 4, 7, 6, 5, 4, 4]


def _world(backend: str, **overrides):
    cfg = ArenaConfig(**{**VISION, **overrides, "kernel_backend": backend})
    builder = SparseSWAMetadataBuilder()
    arena, inputs = make_arena(cfg, [builder])
    return cfg, builder, arena, inputs


def _step(cfg, query_lens, seq_lens, swa_rows) -> HostStep:
    return example_step(cfg, query_lens, seq_lens, swa_rows)[0]


def _eager(inputs, step: HostStep, spans) -> Batch:
    return stage_eager(inputs, step, [0] * step.num_reqs, image_spans=spans)


def _bucket(inputs, step: HostStep, spans, num_reqs: int, num_tokens: int) -> Batch:
    return stage_bucket(inputs, step, [0] * step.num_reqs, num_reqs, num_tokens,
                        image_spans=spans)


def _oracle_step(step: HostStep, spans) -> oracle.SWAStep:
    """The oracle's view of a step and its spans (a mapping or rows)."""
    view = oracle_step(step, [0] * step.num_reqs, padded=False)
    if isinstance(spans, dict):
        spans = [(b, s, e) for b, ranges in sorted(spans.items()) for s, e in ranges]
    view.image_spans = [tuple(int(x) for x in row) for row in spans]
    return view


def _example_b(cfg):
    return _step(cfg, [1, 6, 12], [13, 14, 12], [[4, 9, 10, 12], [5, 6, 11, 13], [2, 7, 8, 0]])


# ------------------------------------------------------------------ worked examples
def test_example_b_eager_and_bucket(backend):
    cfg, builder, _, inputs = _world(backend)
    step = _example_b(cfg)
    meta = builder.build(_eager(inputs, step, SPANS_B))
    assert (meta.num_decodes, meta.num_prefills, meta.num_decode_tokens,
            meta.num_prefill_tokens) == (1, 2, 1, 18)
    assert meta.decode_swa_indices[:, 0].tolist() == [[41, 42, 43, 48]]  # spans never widen it
    assert meta.prefill_swa_indices.shape == (18, 1, 7)
    assert meta.prefill_swa_indices[:, 0].tolist() == ROWS_B
    assert meta.prefill_swa_lens.tolist() == LENS_B
    assert meta.prefill_gather_lens.tolist() == [9, 12]
    exp = oracle.expected_eager(cfg, _oracle_step(step, SPANS_B))
    assert exp["prefill_swa_indices"] == ROWS_B and exp["prefill_swa_lens"] == LENS_B
    bucket = builder.build_mixed(_bucket(inputs, step, SPANS_B, 4, 32))
    assert bucket.prefill_swa_indices[:18, 0].tolist() == ROWS_B
    assert bucket.prefill_swa_lens.tolist() == LENS_B + [0] * 14
    assert bucket.prefill_swa_indices[18:].eq(-1).all()


def test_example_b_prime_no_spans_keeps_the_vision_width(backend):
    cfg, builder, _, inputs = _world(backend)
    step = _step(cfg, [6], [6], [[3, 1]])
    meta = builder.build(_eager(inputs, step, {0: []}))
    assert meta.prefill_swa_lens.tolist() == [1, 2, 3, 4, 4, 4]
    assert meta.prefill_swa_indices[:, 0].tolist() == [
        [12] + [-1] * 6, [12, 13] + [-1] * 5, [12, 13, 14] + [-1] * 4,
        [12, 13, 14, 15] + [-1] * 3, [13, 14, 15, 4] + [-1] * 3, [14, 15, 4, 5] + [-1] * 3]


def test_example_b_double_prime_overflow_is_refused():
    """B'': W = 4, mit = 6, a 12-token span; the reference stores lengths past the row's
    10 columns. Refused here, naming the span."""
    cfg = ArenaConfig(**{**VISION, "max_image_tokens": 6})
    with pytest.raises(InvalidBatchError, match=r"image span 0 \(request 0, positions "
                                                r"\[2, 13\]\) holds 12 tokens"):
        check_image_spans(cfg, {0: [(2, 13)]}, np.array([16]), np.array([16]))
    ok = check_image_spans(cfg, {0: [(2, 11)]}, np.array([16]), np.array([16]))
    assert ok == [(0, 2, 11)]


def test_every_form_of_spans_checks_to_the_same_triples():
    """A mapping, rows as tuples, as lists, with numpy ints, an int array, out of order:
    the same checked ``(request, first, last)`` rows (in the order given), as ints (rows
    in order of plain ints come back as given)."""
    cfg = ArenaConfig(**VISION)
    q, s = np.array([2, 9]), np.array([12, 20])
    want = [(0, 1, 4), (1, 12, 15), (1, 16, 18)]
    for spans in ({0: [(1, 4)], 1: [(12, 15), (16, 18)]}, want, tuple(want),
                  [list(r) for r in want], [tuple(np.int32(x) for x in r) for r in want],
                  np.array(want, dtype=np.int64)):
        got = check_image_spans(cfg, spans, q, s)
        assert [tuple(r) for r in got] == want, spans
        assert all(type(x) is int for r in got for x in r), spans
    assert check_image_spans(cfg, want[::-1], q, s) == want[::-1]
    assert check_image_spans(cfg, [], q, s) == []


def _spans_are_valid(cfg, spans, q, s) -> bool:
    """The rule of ``vllm-0.33-extras.md`` §3 by plain loops (:func:`support.span_fault`)."""
    return not span_fault(cfg, spans, q, s)


@st.composite
def _near_valid_spans(draw):
    """``(spans, query_lens, seq_lens)`` of three requests: spans inside one request's
    context or query, often touching or overlapping each other, one in ten off by one
    (outside the request, straddling the first query position, a token too long, a request
    out of range), in any order or sorted."""
    s = draw(st.lists(st.integers(1, 12), min_size=3, max_size=3))
    q = [draw(st.integers(1, x)) for x in s]
    reach = VISION["sliding_window"] + VISION["max_image_tokens"]
    spans = []
    for _ in range(draw(st.integers(1, 6))):
        b = draw(st.integers(0, 2))
        context = s[b] - q[b]
        lo, hi = (0, context) if context and draw(st.booleans()) else (context, s[b])
        first = draw(st.integers(lo, hi - 1))
        last = draw(st.integers(first, min(hi, first + reach) - 1))
        fault = draw(st.integers(0, 9))
        if fault == 0:
            b = draw(st.sampled_from([-1, 3]))
        elif fault == 1:
            first, last = (first, s[b]) if draw(st.booleans()) else (-1, last)
        elif fault == 2:
            last = hi if hi < s[b] else first + reach
        spans.append((b, first, last))
    if draw(st.booleans()):
        spans.sort()
    return spans, np.array(q), np.array(s)


@settings(max_examples=400)
@given(_near_valid_spans())
def test_the_span_check_agrees_with_the_rule(case):
    """Spans in any order or sorted (the check's one-pass path): accepted exactly when the
    rule holds, else a typed error (:class:`CapacityError` past the capacity); accepted
    spans come back as given."""
    spans, q, s = case
    cfg = ArenaConfig(**VISION)
    if _spans_are_valid(cfg, spans, q, s):
        assert check_image_spans(cfg, spans, q, s) == spans
    else:
        error = CapacityError if len(spans) > cfg.max_image_spans else InvalidBatchError
        with pytest.raises(error):
            check_image_spans(cfg, spans, q, s)


@settings(max_examples=400)
@given(_near_valid_spans(), st.booleans())
def test_the_fast_span_check_passes_only_valid_spans_in_order(case, as_lists):
    """:func:`spans_pass`, the fast path of every step with spans: True exactly for spans the
    rule accepts given in order (by request, then position), for rows as tuples (``run``)
    or as lists (the in-place block's rows)."""
    spans, q, s = case
    cfg = ArenaConfig(**VISION)
    rows = [list(r) for r in spans] if as_lists else spans
    want = _spans_are_valid(cfg, spans, q, s) and spans == sorted(spans)
    assert spans_pass(rows, q, s, cfg.sliding_window + cfg.max_image_tokens) is want


@pytest.mark.parametrize("rows", [
    [(0, 1.0, 2)], [(True, 1, 2)], [(np.int64(0), 1, 2)], [(0, 1)], [(0, 1, 2, 3)], [None],
    [(0, 1, 2), (0, 1, 2)], [(1, 2, 3), (0, 1, 2)],
])
def test_the_fast_span_check_leaves_anything_else_to_the_full_check(rows):
    """Rows that are not three plain ints, repeats and spans out of order are never passed
    by the fast path (the full check converts, sorts or names them)."""
    assert not spans_pass(rows, np.array([4, 4]), np.array([4, 4]), 7)


def test_combined_rows_widen_inside_spans(backend):
    """§5.1: width round_up(K + W + mit, 128), windows [p - max(W - 1, left), p + right] in
    workspace coordinates, against the oracle; for the SWA-only type and C4A (top-k)."""
    cfg, builder, _, inputs = _world(backend)
    step = _example_b(cfg)
    meta = builder.build(_eager(inputs, step, SPANS_B))
    view = _oracle_step(step, SPANS_B)
    topk = torch.full((32, 4), -1, dtype=torch.int32, device=DEVICE)
    pos = meta.positions[: step.num_tokens].long()
    cols = torch.arange(4, device=DEVICE)
    topk[: step.num_tokens] = torch.where(cols[None] < ((pos + 1) // 4)[:, None], cols[None],
                                          -1).int()
    for name, k, rows_topk in (("swaonly", 0, None), ("c4a", 4, topk)):
        t = next(x for x in cfg.layer_types if x.name == name)
        rows, lens = builder.prefill_combined_rows(meta, name, rows_topk)
        assert rows.shape == (18, 128)
        want_rows, want_lens = v41_rows.combined(
            cfg, view, t, None if rows_topk is None else rows_topk.tolist(), k, 18)
        assert lens.tolist() == want_lens, name
        assert rows.tolist() == want_rows, name
        if name == "swaonly":  # p = 9 of request 1 (span 9..12): 3 columns ahead
            assert lens[1].item() == 7


def test_flashinfer_rows_of_a_vision_model_are_refused():
    cfg, builder, _, inputs = _world("torch")
    meta = builder.build(_eager(inputs, _example_b(cfg), SPANS_B))
    with pytest.raises(ArenaError, match="FlashInfer rows of a model with image spans"):
        builder.flashinfer_rows(meta, "swaonly")


# ------------------------------------------------------------------ differential
@st.composite
def steps_with_spans(draw, cfg: ArenaConfig):
    """A host step and non-overlapping spans: inside a prefill request's query (whole) or
    wholly in its context, at most ``W + mit`` tokens each, within the capacity."""
    step = draw(host_steps(cfg, kinds=("mixed", "prefill"), max_seq_len=cfg.max_model_len))
    spans, reach = [], cfg.sliding_window + cfg.max_image_tokens
    for b, (q, length) in enumerate(zip(step.query_lens.tolist(), step.seq_lens.tolist())):
        context, x = length - q, 0
        for _ in range(draw(st.integers(0, 2))):
            if len(spans) == cfg.max_image_spans:
                break
            lo = draw(st.sampled_from([x, max(x, context)]))
            if lo >= length:
                break
            hi = min(length - 1, lo + reach - 1, context - 1 if lo < context else length - 1)
            if hi < lo:
                break
            last = draw(st.integers(lo, hi))
            spans.append((b, lo, last))
            x = last + 1
    return step, spans


@settings(max_examples=25, suppress_health_check=FIXTURE_OK, deadline=None)
@given(data=st.data())
def test_builds_match_the_oracle_with_spans(backend, data):
    cfg, builder, _, inputs = _world(backend, max_model_len=256, max_num_batched_tokens=64,
                                     max_image_tokens=6, max_image_spans=5)
    step, spans = data.draw(steps_with_spans(cfg))
    view = _oracle_step(step, spans)
    meta = builder.build(_eager(inputs, step, spans))
    exp = oracle.expected_eager(cfg, view)
    if exp["num_prefills"]:
        assert meta.prefill_swa_indices[:, 0].tolist() == exp["prefill_swa_indices"]
        assert meta.prefill_swa_lens.tolist() == exp["prefill_swa_lens"]
    bucket = builder.build_mixed(_bucket(inputs, step, spans, cfg.max_num_seqs,
                                         cfg.max_num_batched_tokens))
    exp = oracle.expected_mixed(cfg, view, cfg.max_num_seqs, cfg.max_num_batched_tokens)
    assert bucket.prefill_swa_lens.tolist() == exp["prefill_swa_lens"]
    assert bucket.prefill_swa_indices[:, 0].tolist() == exp["prefill_swa_indices"]


# ------------------------------------------------------------------ the manager's run
def test_run_with_spans_agrees_through_every_build():
    """``GraphManager.run(..., image_spans=...)``: the reference builds and the graph builds
    run eagerly give example B's lengths; a step without spans after one with them gets
    plain windows (the span block is staged again every step)."""
    cfg, builder, arena, inputs = _world("torch")
    step = _example_b(cfg)
    write_step_tables(inputs, step)
    with _manager(arena, builder, inputs) as gm:
        as_lists = [[b, first, last] for b, ranges in SPANS_B.items() for first, last in ranges]
        for eager in (EagerBuild.REFERENCE, EagerBuild.GRAPH):
            for spans in (SPANS_B, as_lists):
                out = gm.run(step.query_lens, step.seq_lens, step.slot_mapping,
                             image_spans=spans, eager=eager)
                assert out.outputs[:18].tolist() == LENS_B, (eager, spans)
        plain = gm.run(step.query_lens, step.seq_lens, step.slot_mapping,
                       eager=EagerBuild.GRAPH)
        assert plain.outputs[:18].tolist() == [4] * 6 + [1, 2, 3] + [4] * 9
        # Fewer spans after more: the rows staged before are cleared.
        gm.run(step.query_lens, step.seq_lens, step.slot_mapping, image_spans=SPANS_B)
        one = {1: [(9, 12)]}
        got = gm.run(step.query_lens, step.seq_lens, step.slot_mapping, image_spans=one,
                     eager=EagerBuild.GRAPH).outputs[:18].tolist()
        assert got == oracle.expected_eager(cfg, _oracle_step(step, one))["prefill_swa_lens"]


def _manager(arena, builder, inputs):
    """A manager whose step returns the prefill SWA lengths."""
    return GraphManager(arena, inputs, [builder],
                        lambda batch, md: md["swa"].prefill_swa_lens, quiet())


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("spans, error, match", [
    ({0: [(2, 5)], 1: [(1, 3), (3, 4)]}, InvalidBatchError,
     r"image span 2 \(request 1, positions \[3, 4\]\) overlaps image span 1"),
    # Out of order: the overlap is found after sorting, and still names both spans.
    ([(1, 3, 4), (0, 2, 5), (1, 1, 3)], InvalidBatchError,
     r"image span 2 \(request 1, positions \[1, 3\]\) overlaps image span 0 "
     r"\(positions \[3, 4\]\)"),
    ([(0, 2, 5), (0, 2, 5)], InvalidBatchError,
     r"image span 1 \(request 0, positions \[2, 5\]\) overlaps image span 0"),
    ({2: [(7, 12)]}, InvalidBatchError, r"image span 0 \(request 2, positions \[7, 12\]\) "
                                        "runs outside its request"),
    ({3: [(0, 1)]}, InvalidBatchError, r"request 3 is outside the step's 3 requests"),
    ({1: [(6, 9)]}, InvalidBatchError, "straddles the first query position 8 of request 1"),
    ({1: [(6, 8)]}, InvalidBatchError, "straddles the first query position 8 of request 1"),
    ([(0, 1, 2)] * 2 + [(0, 3, 3)] * 7, CapacityError,
     r"image span 8 \(request 0, positions \[3, 3\]\) exceeds the capacity "
     "max_image_spans=8"),
    ([(0, 1)], InvalidBatchError, r"image span 0 must be \(request, first, last\) ints"),
])
def test_bad_spans_are_refused_with_nothing_written(spans, error, match):
    cfg, builder, arena, inputs = _world("torch")
    step = _example_b(cfg)
    write_step_tables(inputs, step)
    with _manager(arena, builder, inputs) as gm:
        before = {name: arena[name].clone() for name in arena.names()}
        with pytest.raises(error, match=match):
            gm.run(step.query_lens, step.seq_lens, step.slot_mapping, image_spans=spans)
        for name, was in before.items():
            assert torch.equal(arena[name], was), f"{name} written by a refused step"
        out = gm.run(step.query_lens, step.seq_lens, step.slot_mapping, image_spans=SPANS_B)
        assert out.outputs[:18].tolist() == LENS_B  # the manager still serves steps


def test_a_text_model_refuses_spans():
    cfg = ArenaConfig.deepseek_v4(max_model_len=4096, device=DEVICE)
    with pytest.raises(InvalidBatchError, match="max_image_tokens=0"):
        check_image_spans(cfg, {0: [(0, 1)]}, np.array([4]), np.array([4]))


@pytest.mark.parametrize("fields, match", [
    (dict(max_image_tokens=-1), "max_image_tokens=-1 must be an int >= 0"),
    (dict(max_image_tokens=0, max_image_spans=2), "needs max_image_tokens > 0"),
    (dict(max_image_tokens=30), r"a span of up to mit \+ 3 = 33 tokens"),
    (dict(max_image_spans=0), r"max_image_spans=0 must be in \[1, "),
    (dict(architecture="deepseek_v41", compress_ratios=(0, 2, 1)),
     "this architecture has no image spans"),
])
def test_image_capacities_the_widths_cannot_hold_are_config_errors(fields, match):
    with pytest.raises(ConfigError, match=match):
        ArenaConfig(**{**VISION, **fields})


def test_the_vision_preset():
    cfg = ArenaConfig.preset("deepseek-v4-vision", max_model_len=8192, device=DEVICE)
    assert (cfg.max_image_tokens, cfg.max_image_spans, cfg.image_spans) == (1024, 64, True)
    from staticattn.builders.swa.declarations import combined_width, prefill_swa_width
    assert prefill_swa_width(cfg) == 128 + 1024
    c4a = next(t for t in cfg.layer_types if t.name == "c4a")
    assert combined_width(cfg, c4a) == 1664  # round_up(512 + 128 + 1024, 128)


def test_in_place_steps_carry_spans_and_check_them():
    """The engine writes ``views.image_spans`` rows (unused rows request -1) beside the other
    views; ``launch(k, t)`` checks them like ``run`` does."""
    cfg, builder, arena, inputs = _world("torch")
    step = _example_b(cfg)
    write_step_tables(inputs, step)
    rows = [(0, 2, 5), (1, 1, 3), (1, 9, 12), (2, 2, 4), (2, 7, 10)]
    with _manager(arena, builder, inputs) as gm:
        # Bad spans of the last request and of request 0 alone (the check must see a block
        # whose only span is request 0's).
        for spans, want in ((rows, LENS_B), ([(1, 6, 9)], None), ([(0, 10, 12)], None)):
            views = gm.begin_step()
            views.seq_lens[:3] = step.seq_lens
            views.query_start_loc[:4] = np.concatenate([[0], np.cumsum(step.query_lens)])
            views.slot_mapping[:19] = step.slot_mapping
            views.image_spans[:] = (-1, 0, -1)
            views.image_spans[: len(spans)] = spans
            if want is None:
                with pytest.raises(InvalidBatchError, match="straddles"):
                    gm.launch(3, 19)
            else:
                assert gm.launch(3, 19)[:18].tolist() == want
        # The engine wrote rows itself: a run without spans clears every one of them.
        views = gm.begin_step()
        views.image_spans[5] = (2, 7, 10)
        plain = gm.run(step.query_lens, step.seq_lens, step.slot_mapping)
        assert plain.outputs[:18].tolist() == [4] * 6 + [1, 2, 3] + [4] * 9


def _write_example_b(gm, step):
    views = gm.begin_step()
    views.seq_lens[:3] = step.seq_lens
    views.query_start_loc[:4] = np.concatenate([[0], np.cumsum(step.query_lens)])
    views.slot_mapping[:19] = step.slot_mapping
    return views


@pytest.mark.parametrize("validate", [True, False])
def test_in_place_spans_counted_at_launch(backend, validate):
    """``launch(k, t, num_spans=m)``: the block's first ``m`` rows are the step's spans,
    whatever the engine left past them (a valid span that would change the rows, a bad
    one): the staging stages those rows as unused, checks on or off, and leaves the host
    rows as the engine wrote them."""
    cfg, builder, arena, inputs = _world(backend)
    step = _example_b(cfg)
    write_step_tables(inputs, step)
    rows = [(0, 2, 5), (1, 1, 3), (1, 9, 12), (2, 2, 4), (2, 7, 10)]
    one = [(1, 9, 12)]
    want_one = oracle.expected_eager(cfg, _oracle_step(step, one))["prefill_swa_lens"]
    with _manager(arena, builder, inputs) as gm:
        gm.validate = validate
        for spans, stale, want in ((rows, [(2, 0, 1)], LENS_B), (one, rows[2:], want_one),
                                   ([], rows, [4] * 6 + [1, 2, 3] + [4] * 9)):
            views = _write_example_b(gm, step)
            for i, row in enumerate(spans + stale):
                views.image_spans[i] = row
            written = views.image_spans.copy()
            assert gm.launch(3, 19, num_spans=len(spans))[:18].tolist() == want
            assert inputs.images.device.tolist() == [list(r) for r in spans] + [
                [-1, -1, -1]] * (cfg.max_image_spans - len(spans))
            assert (views.image_spans == written).all()


def test_begin_step_hands_out_a_block_without_the_rows_run_staged():
    """``run`` writes its spans into the block's first rows; the next ``begin_step`` marks
    them unused, so an engine whose steps are found by a scan finds only its own rows."""
    cfg, builder, arena, inputs = _world("torch")
    step = _example_b(cfg)
    write_step_tables(inputs, step)
    plain = [4] * 6 + [1, 2, 3] + [4] * 9
    with _manager(arena, builder, inputs) as gm:
        res = gm.run(step.query_lens, step.seq_lens, step.slot_mapping, image_spans=SPANS_B)
        assert res.outputs[:18].tolist() == LENS_B
        views = _write_example_b(gm, step)
        assert (views.image_spans[:, 0] == -1).all()
        assert gm.launch(3, 19)[:18].tolist() == plain  # a scan: no span
        views = _write_example_b(gm, step)
        views.image_spans[2] = (1, 9, 12)  # the engine's own row, found anywhere
        want = oracle.expected_eager(cfg, _oracle_step(step, [(1, 9, 12)]))
        assert gm.launch(3, 19)[:18].tolist() == want["prefill_swa_lens"]


@pytest.mark.parametrize("spans, num_spans, error, match", [
    ([(1, 6, 9)], 1, InvalidBatchError,
     r"image span 0 \(request 1, positions \[6, 9\]\) straddles"),
    ([(0, 2, 5), (-1, 0, -1)], 2, InvalidBatchError,
     r"image span 1 \(request -1, positions \[0, -1\]\): request -1 is outside"),
    ([(1, 9, 12), (1, 1, 3), (1, 2, 2)], 3, InvalidBatchError,
     r"image span 2 \(request 1, positions \[2, 2\]\) overlaps image span 1"),
    ([], 9, CapacityError, "num_spans=9 exceeds the capacity max_image_spans=8"),
    ([], -1, InvalidBatchError, "num_spans=-1 must be >= 0"),
    ([], 1.0, InvalidBatchError, "num_spans must be an int, got 1.0"),
    ([], True, InvalidBatchError, "num_spans must be an int, got True"),
])
def test_bad_in_place_spans_are_refused_with_the_views_as_written(spans, num_spans, error,
                                                                   match):
    """A bad span among the counted rows, or a count that is not one, is a typed error
    before anything is launched; the block keeps what the engine wrote (a stale row past
    the count included) and the manager serves the next step."""
    cfg, builder, arena, inputs = _world("torch")
    step = _example_b(cfg)
    write_step_tables(inputs, step)
    with _manager(arena, builder, inputs) as gm:
        views = _write_example_b(gm, step)
        for i, row in enumerate(spans + [(2, 1, 1)]):
            views.image_spans[i] = row
        written = views.image_spans.copy()
        before = {name: arena[name].clone() for name in arena.names()}
        with pytest.raises(error, match=match):
            gm.launch(3, 19, num_spans=num_spans)
        assert np.array_equal(views.image_spans, written)
        for name, was in before.items():
            assert torch.equal(arena[name], was), f"{name} written by a refused step"
        views = _write_example_b(gm, step)
        views.image_spans[:3] = [(0, 2, 5), (1, 1, 3), (1, 9, 12)]
        views.image_spans[3:5] = [(2, 2, 4), (2, 7, 10)]
        assert gm.launch(3, 19, num_spans=5)[:18].tolist() == LENS_B


def test_a_span_count_where_no_span_can_be():
    """``num_spans`` on a uniform decode step, or above 0 on a text model: typed errors;
    0 is accepted on both."""
    cfg, builder, arena, inputs = _world("torch")
    step = _example_b(cfg)
    write_step_tables(inputs, step)
    with _manager(arena, builder, inputs) as gm:
        views = gm.begin_step()
        views.seq_lens[:2] = [5, 6]
        views.slot_mapping[:4] = [0, 1, 2, 3]
        with pytest.raises(InvalidBatchError, match="a uniform decode step"):
            gm.launch(2, num_spans=1)
        with pytest.raises(InvalidBatchError, match="num_spans must be an int"):
            gm.launch(2, num_spans=0.0)
        gm.launch(2, num_spans=0)
        gm.begin_step()  # one launch per step begun
        gm.launch(2, num_spans=np.int64(0))
    _, builder, arena, inputs = _world("torch", max_image_tokens=0, max_image_spans=0)
    with _manager(arena, builder, inputs) as gm:
        views = gm.begin_step()
        views.seq_lens[:1], views.slot_mapping[:2] = [4], [0, 1]
        views.query_start_loc[:2] = [0, 2]
        with pytest.raises(InvalidBatchError, match="max_image_tokens=0"):
            gm.launch(1, 2, num_spans=1)
        gm.launch(1, 2, num_spans=0)


@pytest.mark.gpu
def test_a_token_bucket_graph_replays_the_spans_of_each_step():
    """A captured token bucket: the graph's staging kernel copies the span block, so each
    replay sees its own step's spans (with, without, with again), equal to the eager
    build."""
    cfg, builder, arena, inputs = _world("triton")
    step = _example_b(cfg)
    write_step_tables(inputs, step)
    plain = [4] * 6 + [1, 2, 3] + [4] * 9
    with _manager(arena, builder, inputs) as gm:
        gm.capture([], buckets=[32])
        for spans, want in ((SPANS_B, LENS_B), (None, plain), ({1: [(9, 12)]}, None),
                            (SPANS_B, LENS_B)):
            res = gm.run(step.query_lens, step.seq_lens, step.slot_mapping, image_spans=spans)
            assert res.mode == "graph"
            got = res.outputs[:18].tolist()
            eager = gm.run(step.query_lens, step.seq_lens, step.slot_mapping,
                           image_spans=spans, eager=EagerBuild.REFERENCE).outputs[:18].tolist()
            assert got == eager
            if want is not None:
                assert got == want


def test_the_vision_demo_runs_on_every_machine(capsys):
    """``demo --preset deepseek-v4-vision``: on CPU at smaller capacities (images of up to 256
    tokens fit a 1,024-token step), every step checked."""
    import json

    from staticattn.__main__ import main

    assert main(["demo", "--preset", "deepseek-v4-vision", "--steps", "3", "--no-progress",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "PASS" and data["mismatches"] == 0
