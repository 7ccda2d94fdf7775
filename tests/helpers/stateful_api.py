"""A hypothesis state machine over the graph manager's public API (driven by
``graphs/test_stateful_api.py`` on CPU and ``graphs/test_stateful_api_gpu.py`` on a GPU).

One arena per machine, the preset's default builders plus the toy builder, the toy step
(its outputs have a plain-Python oracle, :func:`toy.toy_expected`). Rules: capture (a decode
size or a token bucket; on CPU an emulated graph whose launch runs the captured body), a
step through ``run`` (graph, both eager builds), the in-place ``begin_step``/``launch``,
:class:`ContextGraphs` and :class:`DeviceLengthSteps`, and ``close`` (then a fresh manager
on the same arena). Steps of every composition with the edges drawn often: zero-token
requests, one token, exactly ``max_num_batched_tokens``, ``max_model_len``, bucket edges,
slot -1 and the pool's last slot, every integer dtype, and planted faults (a length past
``max_model_len`` or below the query, a slot past the pool, a decode behind a prefill, a
block id past the pool, too many requests or tokens). The vision preset's steps carry image
spans (:func:`image_spans`, checked by :func:`span_fault`) through every entry: ``run``'s
forms, and in place counted (``launch(k, t, num_spans=m)``) or found by a scan of the block
that ``begin_step`` hands out after ``run`` calls of any span counts, falling ones included.
DeepSeek V4.1's steps carry bounded replay's starts (:func:`replay_starts.replay_starts`,
checked by :func:`replay_starts.replay_fault`) through ``run``'s forms and ``launch(k, t)``,
steps of decodes only among them.

Each step either equals the oracle on its path or raises a typed error
(:class:`~staticattn.errors.StaticAttnError`) exactly when the plain predicate
:func:`step_fault` says the step is invalid, with no arena buffer changed; the manager
serves the next step. The real builders' metadata is compared with ``staticattn.reference``
(:func:`~staticattn.checks.reference_mismatch`) on the eager reference path.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from helpers.replay_starts import replay_fault, replay_starts
from helpers.support import DEVICE, quiet, span_fault
from helpers.toy import ToyBuilder, ToyStep, emulated_graph, toy_expected
from staticattn.arena import ArenaConfig
from staticattn.builders import default_builders, make_arena
from staticattn.checks import reference_mismatch
from staticattn.errors import GraphError, StaticAttnError
from staticattn.graphs import (
    ContextGraphs,
    DeviceLengthSteps,
    EagerBuild,
    GraphKind,
    GraphManager,
)

POOL = 512
CUDA = DEVICE == "cuda"
SMALL = dict(max_num_seqs=8, max_num_batched_tokens=32, max_model_len=1024,
             max_prefill_workspace=1024, max_logits_bytes=64_000, num_sms=8, device=DEVICE)
INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
              np.uint64]
#: ``(path, invalid) -> steps`` drawn so far: a driver asserts that every path saw valid
#: steps and refused ones (the machine is not vacuous).
STATS: Counter = Counter()
PATHS = ["graph", "eager_graph", "eager_reference", "launch", "context", "device"]


#: The vision preset's image capacities at this size: spans past the width and the
#: capacity are drawn often.
VISION = dict(max_image_tokens=16, max_image_spans=4)


def config(preset: str, backend: str) -> ArenaConfig:
    extra = VISION if preset == "deepseek-v4-vision" else {}
    return ArenaConfig.preset(preset, **SMALL, **extra, kernel_backend=backend)


def step_fault(cfg: ArenaConfig, q, s, slots, bad_block: bool, in_place: bool) -> bool:
    """Whether the step is invalid, from the definitions (plain Python): counts within
    capacity, ``q <= L <= max_model_len``, ``-1 <= slot < pool``, decodes first (``run``
    only; the in-place path finds the split on the device), ``L >= next_n`` for an in-place
    uniform decode, and a block id past the pool in a used column (``bad_block``)."""
    q, s, slots = [int(x) for x in q], [int(x) for x in s], [int(x) for x in slots]
    k, n = len(q), cfg.next_n
    bound = POOL * (cfg.swa_block_size if cfg.has_swa else cfg.block_size)
    if not 1 <= k <= cfg.max_num_seqs or sum(q) > cfg.max_num_batched_tokens:
        return True
    if any(x < 0 for x in q) or any(not a <= b <= cfg.max_model_len for a, b in zip(q, s)):
        return True
    if any(not -1 <= x < bound for x in slots) or bad_block:
        return True
    if not in_place:
        late = [i for i, x in enumerate(q) if x > cfg.decode_threshold]
        return bool(late) and any(0 < x <= cfg.decode_threshold for x in q[late[0]:])
    return all(x == n for x in q) and any(x < n for x in s)


@st.composite
def image_spans(draw, cfg: ArenaConfig, q, s):
    """A vision step's spans: up to the capacity and one past it, mostly valid (in a
    request's context or query, in order), one in four with a planted fault (a request past
    the step, past its length, across its first query position, a token too wide, two
    overlapping) and sometimes in any order."""
    reach, spans = cfg.sliding_window + cfg.max_image_tokens, []
    for _ in range(draw(st.integers(0, cfg.max_image_spans + 1))):
        b = draw(st.integers(0, max(0, len(q) - 1)))
        if not len(q) or s[b] < 1:
            spans.append((b, 0, 0))
            continue
        context = s[b] - q[b]
        lo, hi = (0, context) if context and draw(st.booleans()) else (context, s[b])
        if lo >= hi:
            lo, hi = 0, s[b]
        first = draw(st.integers(lo, hi - 1))
        last = draw(st.integers(first, min(hi, first + reach) - 1))
        spans.append((b, first, last))
    fault = draw(st.sampled_from([None] * 6 + ["request", "past", "across", "wide",
                                              "overlap"]))
    if spans and fault:
        i = draw(st.integers(0, len(spans) - 1))
        b, first, last = spans[i]
        spans[i] = {"request": (len(q), first, last), "past": (b, first, max(last, s[b] if
                    b < len(s) else 0)), "across": (b, 0, max(last, 1)),
                    "wide": (b, first, first + reach), "overlap": (b, first, last)}[fault]
        if fault == "overlap":
            spans.append((b, last, last))
    if draw(st.booleans()):
        spans.sort()
    return spans


@st.composite
def steps(draw, cfg: ArenaConfig):
    """``(query_lens, seq_lens, slots, dtype)`` of a step: mostly valid, edges drawn often,
    and about one step in four with a planted fault."""
    n, cap_t, cap_r = cfg.next_n, cfg.max_num_batched_tokens, cfg.max_num_seqs
    fault = draw(st.sampled_from([None] * 12 + ["count", "long", "short", "slot", "below",
                                               "order"]))
    most = min(cap_r, cap_t // n)
    k = draw(st.sampled_from([1, 2, most]) | st.integers(1, cap_r))
    if fault == "count":
        k = draw(st.sampled_from([0, cap_r + 1]))
    shape = draw(st.sampled_from(["uniform", "mixed", "full", "zeros"]))
    if shape == "uniform":
        k = min(k, most) if fault != "count" else k
        q = [n] * k
    else:
        q = []
        for _ in range(k):
            left = max(0, cap_t - sum(q))
            q.append(draw(st.sampled_from([0, 1, n, left]) | st.integers(0, left))
                     if shape != "zeros" else draw(st.sampled_from([0, 1])))
            q[-1] = min(q[-1], left) if fault != "count" else q[-1]
        if shape == "full" and k:  # exactly max_num_batched_tokens
            q[-1] += max(0, cap_t - sum(q))
    q.sort(key=lambda x: x > cfg.decode_threshold)  # decodes first, as run() requires
    if fault == "order" and len(q) > 1:
        q.reverse()
    top = cfg.max_model_len
    s = [x + draw(st.sampled_from([0, top - x, max(0, n - x)]) | st.integers(0, top - x))
         for x in q]
    if k and fault == "long":
        s[draw(st.integers(0, k - 1))] = top + 1
    if k and fault == "short":
        s[-1] = max(0, q[-1] - 1) if q[-1] else 0
    bound = POOL * (cfg.swa_block_size if cfg.has_swa else cfg.block_size)
    t = sum(q)
    slots = [draw(st.sampled_from([-1, 0, bound - 1]) | st.integers(-1, bound - 1))
             for _ in range(min(t, 4))] + list(range(5, 5 + max(0, t - 4)))
    if t and fault == "slot":
        slots[-1] = bound
    if t and fault == "below":
        slots[0] = -2
    dtype = draw(st.sampled_from(INT_DTYPES))
    return q, s, slots, dtype


def _as_mapping(rows) -> dict:
    """Span rows as ``{request: [(first, last), ...]}``."""
    spans: dict = {}
    for b, first, last in rows:
        spans.setdefault(b, []).append((first, last))
    return spans


def as_dtype(values, dtype) -> np.ndarray:
    """``values`` in ``dtype`` when it holds every one, else int64."""
    info = np.iinfo(dtype)
    if all(info.min <= int(v) <= info.max for v in values):
        return np.array(values, dtype=dtype)
    return np.array(values, dtype=np.int64)


class ApiMachine(RuleBasedStateMachine):
    """The machine of one preset and backend; subclasses set ``preset`` and ``backend``."""

    preset = "deepseek-v4"
    backend = "torch"

    def __init__(self) -> None:
        super().__init__()
        self.cfg = cfg = config(self.preset, self.backend)
        self.toy = ToyBuilder()
        self.builders = [*default_builders(cfg), self.toy]
        self.arena, self.inputs = make_arena(cfg, self.builders)
        rng = np.random.default_rng(0)
        for table in self._tables():
            table.copy_(torch.from_numpy(rng.integers(1, POOL, size=tuple(table.shape),
                                                      dtype=np.int32)))
        self.pending: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        # The span block as the engine keeps it: the leading rows it wrote itself for an
        # in-place step (cleared before the next step), and the span counts run() staged
        # since the last hand-out (begin_step() must clear every row they staged, so a
        # step without spans, or with spans found by a scan, reads the whole block).
        self.engine_rows = 0
        self.run_counts: list[int] = []
        self._open()

    def _tables(self) -> list[torch.Tensor]:
        tables = [self.inputs.block_table, *self.inputs.block_tables.values()]
        return tables + ([self.inputs.swa_block_table] if self.cfg.has_swa else [])

    def _open(self) -> None:
        cfg, step = self.cfg, ToyStep(self.cfg, self.arena.device)
        self.gm = GraphManager(self.arena, self.inputs, self.builders, step,
                               quiet(num_kv_blocks=POOL))
        self.cg = ContextGraphs(self.arena, self.inputs, self.builders, step,
                                contexts=[cfg.max_model_len // 4, cfg.max_model_len],
                                options=quiet(num_kv_blocks=POOL))
        self.device = DeviceLengthSteps(self.gm, self._produce)

    def _produce(self, inputs, num_reqs: int, num_tokens: int) -> None:
        """The device-length producer: writes the pending step into the device views."""
        q, s, slots = self.pending
        starts = np.concatenate([[0], np.cumsum(q)]).astype(np.int32)
        inputs.query_start_loc[: len(starts)].copy_(torch.from_numpy(starts))
        inputs.seq_lens[: len(s)].copy_(torch.from_numpy(s.astype(np.int32)))
        inputs.slot_mapping[: len(slots)].copy_(torch.from_numpy(slots.astype(np.int64)))

    @initialize()
    def capture_defaults(self) -> None:
        n = self.cfg.next_n
        if CUDA:
            self.gm.capture([n, 4 * n], buckets=[4, self.cfg.max_num_batched_tokens])
            self.cg.capture([n, 4 * n], buckets=[self.cfg.max_num_batched_tokens])
        else:  # small graphs: steps past their slots or tokens are drawn often
            self.gm.dispatcher.add(emulated_graph(self.gm, GraphKind.DECODE, 2 * n),
                              emulated_graph(self.gm, GraphKind.MIXED, 4))

    @rule(data=st.data())
    def act(self, data) -> None:
        """One rule that draws its action, steps most often. Hypothesis' swarm testing turns
        whole rules off per example, and with a fixed seed its first examples were captures
        and reopenings only: a short run (the GPU's) then drew no step at all."""
        action = data.draw(st.sampled_from(["step"] * 16 + ["capture"] * 3 + ["reopen"]))
        if action == "step":
            # After run() calls whose span counts fell, an in-place step most often: its
            # hand-out must clear the rows past the last count.
            paths = PATHS + ["launch"] * 4 if self._span_counts_fell() else PATHS
            self.step(data, data.draw(st.sampled_from(paths)), data.draw(st.booleans()))
        elif action == "capture":
            self.capture(data.draw(st.sampled_from([GraphKind.DECODE, GraphKind.MIXED])),
                         data.draw(st.integers(0, 5)))
        else:
            self.close_and_reopen()

    def capture(self, kind, which) -> None:
        cfg, n = self.cfg, self.cfg.next_n
        if kind is GraphKind.DECODE:
            size = n * min(cfg.max_num_seqs, cfg.max_num_batched_tokens // n, 1 << which)
        else:
            size = min(cfg.max_num_batched_tokens, 1 << (which + 1))
        if CUDA:
            self.gm.capture([size] if kind is GraphKind.DECODE else [],
                            buckets=[size] if kind is GraphKind.MIXED else [])
        else:
            self.gm.dispatcher.add(emulated_graph(self.gm, kind, size))

    def step(self, data, path, bad_block) -> None:
        q, s, slots, dtype = data.draw(steps(self.cfg))
        spans = None
        if self.cfg.image_spans and path != "device" and data.draw(st.integers(0, 3)):
            spans = (data.draw(image_spans(self.cfg, q, s)),
                     data.draw(st.sampled_from(["rows", "lists", "mapping", "array",
                                                "count", "scan"])))
        # A run() with spans is sometimes followed by the same step with fewer: the span
        # counts a later in-place step's hand-out must clear after.
        fewer = spans is not None and path != "launch" and data.draw(st.integers(0, 3)) > 0
        rs = None
        if self.cfg.bounded_replay and path != "device" and data.draw(st.booleans()):
            rs = data.draw(replay_starts(self.cfg, q, s))
        plant = bad_block and not CUDA and len(q) > 0 and s[0] > 0 and data.draw(
            st.integers(0, 4)) == 0
        tables = self._tables()
        table = tables[data.draw(st.integers(0, len(tables) - 1))]
        if plant:
            kept = int(table[0, 0])
            table[0, 0] = POOL  # request 0 uses column 0 of every table
        try:
            self._step(path, q, s, slots, dtype, plant, spans, rs, fewer)
        finally:
            if plant:
                table[0, 0] = kept

    def _step(self, path, q, s, slots, dtype, planted: bool, spans=None, rs=None,
              fewer: bool = False) -> None:
        cfg = self.cfg
        if self.engine_rows:  # the engine clears the span rows it wrote once launched
            self.inputs.host.image_spans[: self.engine_rows] = (-1, 0, -1)
            self.engine_rows = 0
        fault = step_fault(cfg, q, s, slots, planted, path == "launch")
        STATS[path, fault] += 1
        if path == "launch" and q and all(x == cfg.next_n for x in q):
            # A uniform decode step launches as launch(k): it carries no span and reads no
            # replay start (the engine still writes them).
            spans = None
        elif rs is not None and any(rs):
            bad = replay_fault(cfg, q, s, rs)
            STATS["replay", bad] += 1
            STATS["replay, decodes only"] += all(x <= cfg.decode_threshold for x in q)
            fault = fault or bad
        if spans is not None and not fault:
            bad = span_fault(cfg, spans[0], q, s)
            STATS["spans", bad] += 1
            fault = bad
        if path == "device":
            if fault:
                return  # the producer's values are its own contract (nothing to check)
            self.pending = tuple(np.array(x, dtype=np.int64) for x in (q, s, slots))
            out = self.device.launch(len(q), sum(q))
            assert out[: sum(q)].tolist() == toy_expected(q, s)
            return
        enter = self._enter(path, q, s, slots, dtype, spans, rs)  # the engine's writes first
        before = {name: self.arena[name].clone() for name in self.arena.names()} \
            if fault else None
        try:
            out = enter()
        except StaticAttnError as exc:
            assert fault, f"a valid step refused on {path}: {exc}"
            for name, was in before.items():
                assert torch.equal(self.arena[name], was), f"{name} written by a refused step"
            return
        assert not fault, f"an invalid step accepted on {path}: {q} {s} {slots} {rs}"
        assert out[: sum(q)].tolist() == toy_expected(q, s), path
        if path != "launch" and cfg.image_spans:  # spans staged (0 rows: none)
            self.run_counts.append(0 if spans is None else len(spans[0]))
            if fewer and len(spans[0]) > 1:  # a subset of valid spans is valid
                spans = (spans[0][: len(spans[0]) // 2], spans[1])
                out = self._enter(path, q, s, slots, dtype, spans, rs)()
                assert out[: sum(q)].tolist() == toy_expected(q, s), path
                self.run_counts.append(len(spans[0]))
        # reference_mismatch compares one indexer and the SWA builder: V3.2's and V4's
        # (V4.1's builders meet the oracle in test_v41_*).
        if path == "eager_reference" and not self.inputs.block_tables:
            assert reference_mismatch(self.gm, as_dtype(q, np.int64), as_dtype(s, np.int64),
                                      as_dtype(slots, np.int64)) is None

    def _enter(self, path, q, s, slots, dtype, spans=None, rs=None):
        """The step's entry as a call; for the in-place path the pinned views are written
        now, as an engine writes them before it launches. ``spans``: ``(rows, form)`` of a
        vision step -- the rows given to ``run`` as tuples, lists, a mapping or an array, or
        written into the block and launched with their count (past it a stale row, which
        the launch must mark unused) or found by a scan of the block -- or None. ``rs``:
        the replay starts (None: none given; in place, 0s written)."""
        qa, sa, slots_a = as_dtype(q, dtype), as_dtype(s, dtype), as_dtype(slots, dtype)
        rows, form = spans if spans is not None else (None, None)
        if path in ("graph", "eager_graph", "eager_reference", "context"):
            eager = {"eager_graph": EagerBuild.GRAPH,
                     "eager_reference": EagerBuild.REFERENCE}.get(path)
            runner = self.cg if path == "context" else self.gm
            given = None if rows is None else {
                "lists": lambda: [list(r) for r in rows],
                "mapping": lambda: _as_mapping(rows),
                "array": lambda: np.array(rows, dtype=np.int32).reshape(-1, 3),
            }.get(form, lambda: rows)()
            starts = None if rs is None else np.asarray(rs)
            return lambda: runner.run(qa, sa, slots_a, eager=eager, image_spans=given,
                                      replay_start=starts).outputs
        k, t = len(q), sum(q)
        # In place, half of run()'s forms scan the block and half count the rows.
        scan = rows is None or form in ("scan", "rows", "lists") and len(rows) <= len(
            self.inputs.host.image_spans)
        count = None if scan else len(rows)
        fell = self._span_counts_fell()
        self.run_counts = []
        host = self.gm.begin_step()
        if k > self.cfg.max_num_seqs or t > self.cfg.max_num_batched_tokens:
            return lambda: self.gm.launch(k, t, num_spans=count)  # refused on the counts
        host.seq_lens[:k] = s
        host.slot_mapping[:t] = slots
        if host.replay_start is not None:
            host.replay_start[:k] = 0 if rs is None else rs
        if k and all(x == self.cfg.next_n for x in q):
            return lambda: self.gm.launch(k)
        host.query_start_loc[: k + 1] = np.concatenate([[0], np.cumsum(q)])
        block = host.image_spans
        if block is None:
            return lambda: self.gm.launch(k, t)
        written = [] if rows is None else rows[: len(block)]
        if count is not None:
            block[:] = (len(q) + 5, 0, 0)  # stale rows past the count
        if written:
            block[: len(written)] = written
        self.engine_rows = len(block) if count is not None else len(written)
        STATS["scan after falling span counts"] += count is None and fell

        def launch():
            out = self.gm.launch(k, t, num_spans=count)
            staged = self.inputs.images.device.tolist()
            if count is not None:  # the rows past the count were staged as unused
                assert staged[count:] == [[-1] * 3] * (len(staged) - count), staged
            else:  # a scan: the engine's rows and nothing else
                assert [r for r in staged if r[0] != -1] == [list(r) for r in written], staged
            return out
        return launch

    def _span_counts_fell(self) -> bool:
        """Whether a run() since the last hand-out staged more span rows than the last one
        that staged any (a run without spans stages none and leaves the rows)."""
        staged = [c for c in self.run_counts if c]
        return bool(staged) and max(staged) > staged[-1]

    def close_and_reopen(self) -> None:
        self.gm.close()
        self.cg.close()
        try:
            self.gm.run([self.cfg.next_n], [self.cfg.next_n], [-1] * self.cfg.next_n)
        except GraphError as exc:
            assert "closed" in str(exc)
        else:
            raise AssertionError("a closed manager ran a step")
        self._open()

    @invariant()
    def addresses_never_move(self) -> None:
        if not hasattr(self, "fingerprint"):
            self.fingerprint = self.arena.fingerprint()
        assert self.arena.fingerprint() == self.fingerprint

    def teardown(self) -> None:
        self.gm.close()
        self.cg.close()


#: Steps per preset of the GPU run: short by default; ``scripts/gpu_check.py`` runs the long
#: machine (``STATICATTN_STATEFUL_STEPS``).
DEFAULT_GPU_STEPS = 300


def run_machine(preset: str, backend: str, examples: int, steps_per_example: int,
                derandomize: bool = True, check: bool = True) -> None:
    """Run the machine of ``preset`` on ``backend``; then, unless ``check`` is False, check
    it was not vacuous (:func:`check_not_vacuous`). ``derandomize=False`` draws new examples
    on every call (a long run made of rounds, checked once over all of them)."""
    STATS.clear()
    machine = type(f"Machine_{preset}_{backend}".replace("-", "_").replace(".", "_"),
                   (ApiMachine,), {"preset": preset, "backend": backend})
    run_state_machine_as_test(machine, settings=settings(
        max_examples=examples, stateful_step_count=steps_per_example, deadline=None,
        suppress_health_check=list(HealthCheck), derandomize=derandomize, database=None,
        print_blob=True))
    if check:
        check_not_vacuous(preset, STATS)


def check_not_vacuous(preset: str, ran: Counter) -> None:
    """Every path drawn valid and invalid; the vision preset's spans and V4.1's replay starts
    drawn valid and invalid, and V4.1's starts on steps of decodes only."""
    assert all(ran[path, False] for path in PATHS), ran
    assert sum(ran[path, True] for path in PATHS), ran
    if "vision" in preset:  # valid and invalid image spans both drawn
        assert ran["spans", False] and ran["spans", True], ran
    if "v4.1" in preset:  # valid and invalid replay starts, starts on steps of decodes only
        assert ran["replay", False] and ran["replay", True], ran
        assert ran["replay, decodes only"], ran
