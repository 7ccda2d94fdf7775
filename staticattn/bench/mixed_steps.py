"""Mixed-step benchmark: the steps of a loaded server with chunked prefill, replayed through
token-bucket graphs, against the reference eager build of the same steps.

Scenarios (each on its own config, graphs captured for every token bucket; DeepSeek V4 and
V4.1-Flash side by side, V3.2 for the reference batch):

* ``reference mixed batch``: 16 decodes (``next_n`` tokens each, contexts up to 32K), a
  fresh 3,000-token prefill and a 3,000-token chunk continuing at context 20,000;
* ``chunked-prefill trace``: 64 running decodes and one 2,048-token chunk of a long prompt
  per step, the prompt's context growing by 2,048 tokens a step;
* ``mixed + image spans``: the reference mixed batch on DeepSeek V4's vision variant
  (prefill SWA rows ``W + 1024`` wide) with three images (:data:`IMAGE_SPANS`): two in the
  fresh prefill, one in the continuing chunk; next to V4's own row of the same batch.

Per scenario: host wall time of ``GraphManager.run`` (validation, staging, launch) and of the
in-place API (``begin_step`` + ``launch(k, t)``, with images ``launch(k, t, num_spans=m)``;
the engine's writes not counted), the GPU time of the replay, and the same for the two
eager paths: ``run(eager=EagerBuild.GRAPH)`` (the builds a graph holds, launched eagerly:
what a step no graph holds runs) and ``run(eager=EagerBuild.REFERENCE)`` (the reference
builds); medians with min and max, each step started on an idle device.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from staticattn.arena import ArenaConfig
from staticattn.bench.bench_report import (
    HostGpu,
    Stat,
    environment,
    flat_rows,
    host_gpu_plot,
    text_table,
)
from staticattn.bench.floor import launch_floor
from staticattn.bench.random_batches import (
    NUM_KV_BLOCKS,
    RandomStep,
    fixed_step,
    write_block_rows,
)
from staticattn.bench.replay import in_place_host_us, step_times_us
from staticattn.builders.contract import make_arena
from staticattn.graphs.manager import GraphManager
from staticattn.graphs.options import EagerBuild, GraphOptions

__all__ = ["IMAGE_SPANS", "MIXED_SCENARIOS", "TRACE_SCENARIOS", "MixedReport", "MixedRow",
           "chunked_prefill_trace", "reference_mixed_batch", "run_mixed_bench"]

#: (label, preset, next_n) of the configs the reference mixed batch runs on.
MIXED_SCENARIOS = (("V4", "deepseek-v4", 1), ("V4", "deepseek-v4", 2),
                   ("V3.2", "deepseek-v3.2", 1), ("V4.1", "deepseek-v4.1-flash", 2))
#: (label, preset, next_n) of the configs the chunked-prefill trace runs on.
TRACE_SCENARIOS = (("V4", "deepseek-v4", 2), ("V4.1", "deepseek-v4.1-flash", 2))
#: The reference mixed batch's images on the vision preset, ``(request, first, last)``: a
#: full 1,027-token image (``mit + 3``) and a 501-token one in the fresh 3,000-token
#: prefill (request 16), a full one in the chunk at context 20,000 (request 17).
IMAGE_SPANS = ((16, 100, 1126), (16, 2000, 2500), (17, 20500, 21526))


@dataclass(slots=True)
class MixedRow:
    scenario: str
    model: str
    next_n: int
    num_reqs: int
    num_tokens: int
    bucket: int
    graph: HostGpu
    #: ``begin_step()`` + ``launch(k, t)``, the engine's writes excluded.
    in_place_host_us: Stat
    #: The reference builds, eagerly.
    eager: HostGpu
    #: The graph builds run eagerly: what a step no graph holds runs.
    fallback: HostGpu


@dataclass(slots=True)
class MixedReport:
    env: dict
    floor: dict[str, Stat] | None
    rows: list[MixedRow] = field(default_factory=list)

    def table(self) -> str:
        """The scenarios as a fixed-width text table (microsecond medians), then the floor."""
        head = (f"{'scenario':<24} {'model':<13} {'toks':>5} {'bucket':>6} | "
                f"{'in-place':>8} {'run()':>7} {'GPU':>6} | {'fallbk':>6} {'GPU':>6} | "
                f"{'eager':>7} {'GPU':>6} | {'host x':>6}")
        lines = [
            f"{r.scenario:<24} {r.model + ' n=' + str(r.next_n):<13} {r.num_tokens:>5} "
            f"{r.bucket:>6} | {r.in_place_host_us.median:>8.1f} "
            f"{r.graph.host_us.median:>7.1f} {r.graph.gpu_us.median:>6.1f} | "
            f"{r.fallback.host_us.median:>6.1f} {r.fallback.gpu_us.median:>6.1f} | "
            f"{r.eager.host_us.median:>7.1f} {r.eager.gpu_us.median:>6.1f} | "
            f"{r.eager.over(r.graph)[0]:>6.1f}" for r in self.rows]
        return text_table(head, lines, "(microseconds, medians; fallbk = the graph builds run "
                          "eagerly, what a step no graph holds runs; eager = the reference "
                          "builds)", self.floor)

    def to_json(self) -> str:
        """The report as JSON: env, floor and one row per scenario (microseconds)."""
        return json.dumps(flat_rows(asdict(self)), indent=2)

    def plot(self, path: str) -> None:
        """Write a PNG of each scenario's host and GPU time, graph vs eager, to ``path``."""
        labels = [f"{r.scenario}\n{r.model} n={r.next_n}" for r in self.rows]
        x = np.arange(len(self.rows))

        def draw(ax, kind: str) -> None:
            graph = [getattr(r.graph, f"{kind}_us").median for r in self.rows]
            eager = [getattr(r.eager, f"{kind}_us").median for r in self.rows]
            ax.bar(x - 0.2, graph, 0.4, label="graph replay")
            ax.bar(x + 0.2, eager, 0.4, label="eager reference build")
            ax.set_xticks(x, labels, fontsize=7)
            ax.set_yscale("log")
            ax.set_ylabel(f"{'host' if kind == 'host' else 'GPU'} time per step (us)")

        host_gpu_plot(path, (12, 4.2), draw)


def _measure(gm: GraphManager, steps: list[RandomStep], reps: int,
             image_spans=None) -> dict[str, list[float]]:
    out = {"graph_host": [], "in_place": [], "graph_gpu": [], "eager_host": [],
           "eager_gpu": [], "fallback_host": [], "fallback_gpu": []}
    per_step = max(1, reps // len(steps))
    for step in steps:
        args = (step.query_lens, step.seq_lens, step.slot_mapping)
        for _ in range(3):  # warm both paths
            assert gm.run(*args, image_spans=image_spans).mode == "graph"
            gm.run(*args, eager=EagerBuild.REFERENCE, image_spans=image_spans)
            gm.run(*args, eager=EagerBuild.GRAPH, image_spans=image_spans)
        for path, eager in (("graph", None), ("eager", EagerBuild.REFERENCE),
                            ("fallback", EagerBuild.GRAPH)):
            host, gpu = step_times_us(gm, args, eager, per_step, image_spans=image_spans)
            out[f"{path}_host"] += host
            out[f"{path}_gpu"] += gpu
        out["in_place"] += in_place_host_us(gm, step.seq_lens, step.slot_mapping, per_step,
                                            step.query_lens, image_spans=image_spans)
    return out


def run_mixed_bench(
    builders_factory: Callable[[ArenaConfig], list],
    step_factory: Callable[[ArenaConfig], Callable] | None,
    *,
    reps: int = 200,
    seed: int = 0,
    progress: bool = False,
) -> MixedReport:
    """Time the scenarios of the module docstring (metadata only unless ``step_factory``)."""
    report = MixedReport(environment(), launch_floor())
    rng = np.random.default_rng(seed)
    scenarios = [(label, preset, n, "reference mixed batch")
                 for label, preset, n in MIXED_SCENARIOS]
    scenarios += [(label, preset, n, "chunked-prefill trace")
                  for label, preset, n in TRACE_SCENARIOS]
    scenarios.append(("V4-vision", "deepseek-v4-vision", 2, "mixed + image spans"))
    for model, preset, n, scenario in scenarios:
        cfg = ArenaConfig.preset(preset, num_speculative_tokens=n - 1)
        builders = builders_factory(cfg)
        arena, inputs = make_arena(cfg, builders)
        step = step_factory(cfg) if step_factory is not None else (lambda batch, md: None)
        options = GraphOptions(progress=progress, num_kv_blocks=NUM_KV_BLOCKS)
        with GraphManager(arena, inputs, builders, step, options) as gm:
            gm.capture()
            steps = ([reference_mixed_batch(inputs, rng)] if scenario != "chunked-prefill trace"
                     else chunked_prefill_trace(inputs, rng, steps=20))
            spans = IMAGE_SPANS if scenario == "mixed + image spans" else None
            timings = _measure(gm, steps, reps, spans)
            first = steps[0]
            bucket = gm.run(first.query_lens, first.seq_lens, first.slot_mapping).graph_size
            report.rows.append(MixedRow(
                scenario, model, n, first.query_lens.shape[0],
                int(first.slot_mapping.shape[0]), bucket,
                HostGpu.of(timings["graph_host"], timings["graph_gpu"]),
                Stat.of(timings["in_place"]),
                *(HostGpu.of(timings[f"{path}_host"], timings[f"{path}_gpu"])
                  for path in ("eager", "fallback")),
            ))
    return report


def reference_mixed_batch(inputs, rng) -> RandomStep:
    """The reference mixed batch: 16 decodes of ``next_n`` tokens (contexts up to 32K), a
    fresh 3,000-token prefill and a 3,000-token chunk continuing at context 20,000."""
    n = inputs.config.next_n
    contexts = rng.integers(n, 32_768, size=16)
    q = np.array([n] * 16 + [3000, 3000])
    s = np.concatenate([contexts, [3000, 23_000]])
    return fixed_step(inputs, q, s, rng)


def chunked_prefill_trace(inputs, rng, steps: int) -> list[RandomStep]:
    """The chunked-prefill trace: 64 running decodes and one 2,048-token chunk of a long
    prompt per step, for ``steps`` steps, the prompt's context growing by 2,048 a step."""
    n = inputs.config.next_n
    contexts = rng.integers(n, 32_768, size=64)
    q = np.array([n] * 64 + [2048])
    longest = np.concatenate([contexts + steps * n, [2048 * steps]])
    rows = write_block_rows(inputs, longest.astype(np.int32), rng, NUM_KV_BLOCKS)
    return [fixed_step(inputs, q, np.concatenate([contexts + i * n, [2048 * (i + 1)]]), rng,
                       rows=rows) for i in range(steps)]
