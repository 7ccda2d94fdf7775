"""Where a step's host time goes: per-phase medians for the captured and the eager paths,
next to the one-kernel launch floor measured in the same run.

Each path is timed by calling the graph manager's own phases -- the checks
(:class:`~staticattn.validation.step_checks.StepChecks`), the dispatcher's lookup, the
array front end's staging and replay (:class:`~staticattn.graphs.runner.StepRunner`), the
eager builds (:class:`~staticattn.graphs.eager.EagerSteps`) -- in the order its entry point
calls them, with a clock read as each ends (each step started on an idle device):

* ``run()``, decode replay: check (the pre-screen), dispatch, stage (the lengths, slots and
  count into the pinned staging), launch (``cudaGraphLaunch`` and the result);
* in-place, decode replay: wait (``begin_step``), check (the view checks), launch (the
  manager's ``launch(k)`` with its checks off: count, lookup, ``cudaGraphLaunch``); the
  engine's writes into the views are not counted;
* ``run(eager=EagerBuild.GRAPH)``, the eager path of a step no graph holds: check, stage,
  the builds a graph holds launched eagerly (staging kernels, every ``build_decode`` or
  ``build_mixed``, the step) with the result -- through the recorded launches of the step's
  extents (recorded by an earlier step), recording them (the second step at these extents:
  the recorded launches are dropped before each, the extents kept as seen), and with no
  recorded launches (the builds themselves, which is also what the first step at new
  extents runs);
* ``run(eager=EagerBuild.REFERENCE)``: check, stage, staging kernels, one phase per
  builder's ``build``, the step, the result -- the reference builds.

Each eager path is timed for a uniform decode step and for the reference mixed batch.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch
from tqdm import tqdm

from staticattn.arena import ArenaConfig
from staticattn.bench.bench_report import Stat, environment, floor_lines
from staticattn.bench.floor import launch_floor
from staticattn.bench.mixed_steps import reference_mixed_batch
from staticattn.bench.random_batches import NUM_KV_BLOCKS, RandomStep, fixed_step
from staticattn.builders.contract import make_arena
from staticattn.graphs.captured import EagerReason
from staticattn.graphs.manager import GraphManager
from staticattn.graphs.options import GraphOptions, StagingGuard
from staticattn.validation.step_checks import CheckedStep

__all__ = ["Breakdown", "run_breakdown"]

#: One step of a path: runs the step, calling ``mark(phase)`` as each phase ends
#: (``mark(None)``: what ran since the last mark is not a phase, and is not counted).
PathStep = Callable[[Callable[[str | None], None]], None]
_FORCED = EagerReason.FORCED


def _phase_medians(path: PathStep, setup: Callable[[], None], reps: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {}
    clock = [0.0, 0]  # the last mark, and the step's rep (the first 10 warm up)

    def mark(name: str | None) -> None:
        now = time.perf_counter()
        if clock[1] >= 10 and name is not None:
            samples.setdefault(name, []).append((now - clock[0]) * 1e6)
        clock[0] = time.perf_counter()

    for rep in range(reps + 10):
        setup()
        torch.cuda.synchronize()
        clock[:] = time.perf_counter(), rep
        path(mark)
    medians = {name: statistics.median(xs) for name, xs in samples.items()}
    medians["total"] = sum(medians.values())
    return medians


def _run_decode(gm: GraphManager, step: RandomStep) -> tuple[PathStep, Callable[[], None]]:
    s, slots = step.seq_lens, step.slot_mapping
    k, n = step.query_lens.shape[0], gm.config.next_n

    def path(mark) -> None:
        gm.checks.uniform_decode(k, s, slots)
        mark("check")
        g = gm.dispatcher.decode(k)
        mark("dispatch")
        gm.inputs.stage_uniform_decode(s, slots)
        mark("stage")
        gm.runner.replay(g, k * n)
        mark("launch")

    return path, lambda: None


def _in_place_decode(gm: GraphManager, step: RandomStep) -> tuple[PathStep, Callable[[], None]]:
    k = step.query_lens.shape[0]

    def path(mark) -> None:
        views = gm.begin_step()
        mark("wait")
        views.seq_lens[:k] = step.seq_lens  # the engine's writes: not a phase
        views.slot_mapping[: step.slot_mapping.shape[0]] = step.slot_mapping
        mark(None)
        gm.checks.views.decode(k)
        mark("check")
        gm.launch(k)  # its own checks are off for this path: the phase before
        mark("launch")

    return path, lambda: None


def _run_graph_build(gm: GraphManager, step: RandomStep,
                     launches: str = "hit") -> tuple[PathStep, Callable[[], None]]:
    """``run(eager=EagerBuild.GRAPH)``'s phases; ``launches``: "hit" (the step's launches
    were recorded on an earlier step), "recorded" (dropped before each step, the extents
    kept as seen, so each records them: the second step at these extents) or "off" (the
    builds themselves)."""
    q, s, slots = step.query_lens, step.seq_lens, step.slot_mapping
    k, t, n = q.shape[0], slots.shape[0], gm.config.next_n
    uniform = bool((q == n).all())
    recorded = gm.eager.recorded_launches

    def setup() -> None:
        if launches == "recorded" and recorded is not None:
            recorded.clear(keep_seen=True)

    def path(mark) -> None:
        if uniform:  # the lean path run() takes for a uniform decode step
            gm.checks.uniform_decode(k, s, slots)
            checked = CheckedStep(n, n, None, None)
        else:
            checked = gm.runner.check(q, s, slots)
        mark("check")
        gm.runner.stage(q, s, slots, checked, uniform)
        mark("stage")
        gm.runner.eager_graph_builds(k, t, uniform, _FORCED, recorded=launches != "off")
        mark("graph builds + step")

    return path, setup


def _run_eager(gm: GraphManager, step: RandomStep) -> tuple[PathStep, Callable[[], None]]:
    q, s, slots = step.query_lens, step.seq_lens, step.slot_mapping

    def path(mark) -> None:
        checked = gm.runner.check(q, s, slots)
        mark("check")
        gm.runner.eager_reference_builds(q, s, slots, checked, _FORCED, mark)
        mark("result")

    return path, lambda: None


@dataclass(slots=True)
class Breakdown:
    """Per-phase host medians (us) of each path, and the launch floor of the same run."""

    header: str
    paths: dict[str, dict[str, float]]
    floor: dict[str, Stat] | None

    def table(self) -> str:
        """The breakdown as text: one line per path, then the floor."""
        return "\n".join([self.header] + [
            f"{label}: " + ", ".join(f"{k} {v:.1f}" for k, v in medians.items())
            for label, medians in self.paths.items()] + floor_lines(self.floor))

    def to_json(self) -> str:
        """The breakdown as JSON: ``{"header", "paths": {label: {phase: us}}, "floor"}``."""
        floor = None if self.floor is None else {k: asdict(v) for k, v in self.floor.items()}
        return json.dumps({"header": self.header, "paths": self.paths, "floor": floor},
                          indent=2)


def run_breakdown(config: ArenaConfig, builders_factory: Callable[[ArenaConfig], list],
                  num_reqs: int = 32, reps: int = 300, seed: int = 0,
                  staging_guard: StagingGuard = StagingGuard.STAGING,
                  progress: bool = False) -> Breakdown:
    """The per-phase medians for ``config``, metadata only; ``staging_guard`` as in
    :class:`~staticattn.graphs.GraphOptions`; ``progress``: a bar over the paths."""
    rng = np.random.default_rng(seed)
    floor = launch_floor()
    builders = builders_factory(config)
    arena, inputs = make_arena(config, builders)
    n = config.next_n
    header = (f"host time per phase, us (medians of {reps}) | device "
              f"{environment()['device']} | next_n {n}, {num_reqs} requests | staging guard "
              f"after the {staging_guard.value}")
    options = GraphOptions(progress=False, staging_guard=staging_guard,
                           num_kv_blocks=NUM_KV_BLOCKS)
    with GraphManager(arena, inputs, builders, lambda batch, md: None, options) as gm:
        gm.capture([num_reqs * n], buckets=())
        decode = fixed_step(inputs, np.full(num_reqs, n),
                            rng.integers(n, 32_768, size=num_reqs), rng)
        mixed = reference_mixed_batch(inputs, rng)
        paths = [("run(), decode replay", _run_decode(gm, decode)),
                 ("in-place, decode replay", _in_place_decode(gm, decode))]
        for what, step in (("decode", decode), ("reference mixed batch", mixed)):
            paths += [(f"run(eager=GRAPH), {what}", _run_graph_build(gm, step)),
                      (f"run(eager=GRAPH), {what}, launches recorded",
                       _run_graph_build(gm, step, "recorded")),
                      (f"run(eager=GRAPH), {what}, no recorded launches",
                       _run_graph_build(gm, step, "off"))]
        paths += [("run(eager=REFERENCE), decode", _run_eager(gm, decode)),
                  ("run(eager=REFERENCE), reference mixed batch", _run_eager(gm, mixed))]
        medians = {}
        for label, (path, setup) in tqdm(paths, desc="breakdown", unit="path",
                                         disable=not progress, leave=False):
            # The in-place path times its checks as a phase of their own.
            gm.validate = not label.startswith("in-place")
            medians[label] = _phase_medians(path, setup, reps)
        gm.validate = True
    return Breakdown(header, medians, floor)

