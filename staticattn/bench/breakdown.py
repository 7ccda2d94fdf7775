"""Where a step's host time goes: per-phase medians for the captured and the eager paths,
next to the one-kernel launch floor measured in the same run.

Each path is timed by calling, in order, the same pieces its entry point calls, with a clock
read between them (each step started on an idle device):

* ``run()``, decode replay: validate (the pre-screen), stage (write the lengths, slots and
  count into the pinned staging), launch, bookkeeping (the result object);
* in-place, decode replay: wait (``begin_step``), validate (the view checks), launch (count,
  lookup, ``cudaGraphLaunch``); the engine's writes into the views are not counted;
* ``run(eager=EagerBuild.GRAPH)``, the eager path of a step no graph holds: validate,
  stage, the builds a graph holds launched eagerly (staging kernels, every ``build_decode``
  or ``build_mixed``, the step), bookkeeping -- through the recorded launches of the step's
  extents (recorded by an earlier step), recording them (the second step at these extents:
  the recorded launches are dropped before each, the extents kept as seen), and with no
  recorded launches (the builds themselves, which is also what the first step at new
  extents runs);
* ``run(eager=EagerBuild.REFERENCE)``: validate, stage, staging kernels, one phase per
  builder's ``build``, the step, bookkeeping -- the reference builds.

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
from staticattn.builders.batch import Batch
from staticattn.builders.contract import make_arena
from staticattn.graphs.captured import RunResult, slice_outputs
from staticattn.graphs.manager import GraphManager
from staticattn.graphs.options import GraphOptions, StagingGuard
from staticattn.validation.host_arrays import screen_step, step_passes, uniform_decode_passes

__all__ = ["Breakdown", "run_breakdown"]

Phases = list[tuple[str, Callable[[], object]]]


def _phase_medians(phases_of: Callable[[], Phases], reps: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {}
    for rep in range(reps + 10):
        phases = phases_of()
        torch.cuda.synchronize()
        clock = time.perf_counter()
        for name, fn in phases:
            fn()
            now = time.perf_counter()
            if rep >= 10:
                samples.setdefault(name, []).append((now - clock) * 1e6)
            clock = now
    medians = {name: statistics.median(xs) for name, xs in samples.items()}
    medians["total"] = sum(medians.values())
    return medians


def _run_decode(gm: GraphManager, step: RandomStep) -> Callable[[], Phases]:
    k, n = step.query_lens.shape[0], gm.config.next_n
    g = gm.table.decode[k]

    def phases() -> Phases:
        return [
            ("validate", lambda: uniform_decode_passes(k, step.seq_lens, step.slot_mapping,
                                                       gm.config, gm.slot_bound)),
            ("stage", lambda: gm.inputs.stage_uniform_decode(step.seq_lens, step.slot_mapping)),
            ("launch", g.launch),
            ("bookkeeping", lambda: RunResult(g.outputs_for(k * n), "graph", g.size, None,
                                              k * n, None, g.kind)),
        ]

    return phases


def _in_place_decode(gm: GraphManager, step: RandomStep) -> Callable[[], Phases]:
    k = step.query_lens.shape[0]

    def write() -> None:
        gm.host.seq_lens[:k] = step.seq_lens
        gm.host.slot_mapping[: step.slot_mapping.shape[0]] = step.slot_mapping

    def launch() -> None:
        gm.validate = False  # the checks are the phase before
        gm.launch(k)
        gm.validate = True

    def phases() -> Phases:
        write()
        return [("wait", gm.begin_step), ("validate", lambda: gm.in_place.checks.decode(k)),
                ("launch", launch)]

    return phases


def _run_eager(gm: GraphManager, step: RandomStep) -> Callable[[], Phases]:
    q, s, slots = step.query_lens, step.seq_lens, step.slot_mapping
    state: dict[str, object] = {}

    def stage() -> None:
        state["counts"] = gm.inputs.stage(q, s, slots)

    def kernels() -> None:
        counts = state["counts"]
        gm.inputs.copy_to_device(counts.num_reqs_padded, counts.num_tokens_padded)
        state["batch"] = Batch.from_staged(gm.inputs, counts)
        state["md"] = {}

    def build(builder) -> Callable[[], None]:
        return lambda: state["md"].__setitem__(builder.name, builder.build(state["batch"]))

    def phases() -> Phases:
        return [("validate", lambda: step_passes(q, s, slots, gm.config, gm.slot_bound)),
                ("stage", stage),
                ("staging kernels", kernels),
                *[(f"build {b.name}", build(b)) for b in gm.builders],
                ("step", lambda: state.__setitem__("out", gm.step(state["batch"], state["md"]))),
                ("bookkeeping", lambda: RunResult(slice_outputs(state["out"], slots.shape[0]),
                                                  "eager", None, "forced", slots.shape[0]))]

    return phases


def _run_graph_build(gm: GraphManager, step: RandomStep,
                     launches: str = "hit") -> Callable[[], Phases]:
    """``run(eager=EagerBuild.GRAPH)``'s phases; ``launches``: "hit" (the step's launches
    were recorded on an earlier step), "recorded" (dropped before each step, the extents
    kept as seen, so each records them: the second step at these extents) or "off" (the
    builds themselves)."""
    q, s, slots = step.query_lens, step.seq_lens, step.slot_mapping
    k, t, n = q.shape[0], slots.shape[0], gm.config.next_n
    uniform = bool((q == n).all())
    recorded = gm.eager.recorded_launches

    def validate() -> None:
        if uniform:  # the lean path run() takes for a uniform decode step
            uniform_decode_passes(k, s, slots, gm.config, gm.slot_bound)
        else:
            screen_step(q, s, slots, gm.config, gm.slot_bound)

    def builds() -> None:
        gm.eager.graph_builds(k, t, uniform, recorded=launches != "off")

    def phases() -> Phases:
        if launches == "recorded" and recorded is not None:
            recorded.clear(keep_seen=True)
        return [("validate", validate),
                ("stage", lambda: gm.runner.stage_for_graph(q, s, slots, uniform)),
                ("graph builds + step", builds),
                ("bookkeeping", lambda: RunResult(None, "eager", None, "forced", t))]

    return phases


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
        medians = {label: _phase_medians(phases, reps)
                   for label, phases in tqdm(paths, desc="breakdown", unit="path",
                                             disable=not progress, leave=False)}
    return Breakdown(header, medians, floor)

