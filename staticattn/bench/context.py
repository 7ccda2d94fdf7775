"""What a captured step's cost owes to ``max_model_len``: the same decode steps, every
context at most ``C``, replayed three ways in one run: through a graph captured for the
capacity (say 1M tokens), through the context-bucketed graphs of the same capacity arena
(:class:`~staticattn.graphs.contexts.ContextGraphs` with a bucket at ``C``), and through a
graph of a separate arena whose ``max_model_len`` is ``C`` (the ideal). Capacity over ideal
is what serving short contexts under a long limit costs without buckets; bucketed over
ideal, what is left with them.

    python -m staticattn bench --context 2048 8192 65536 --max-model-len 1048576
           [--batch-requests 32] [--consumer none|gather|real] [--reps 200] [--json ctx.json]

Per context ``C`` (and batch size): GPU µs per step (CUDA events around the replay) and host
µs of ``run``, medians with min and max over ``reps`` steps, for both graphs, drawn from one
seed so both replay the same lengths. GPU only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
from tqdm import tqdm

from staticattn.arena import ArenaConfig
from staticattn.bench.bench_report import HostGpu, environment
from staticattn.bench.random_batches import NUM_KV_BLOCKS, random_uniform_decode
from staticattn.bench.replay import step_times_us
from staticattn.builders.contract import make_arena
from staticattn.graphs.contexts import ContextGraphs
from staticattn.graphs.manager import GraphManager
from staticattn.graphs.options import GraphOptions

__all__ = ["ContextReport", "ContextRow", "run_context_bench"]


@dataclass(slots=True)
class ContextRow:
    """One context and batch size: the capacity-wide graph (and, below the capacity, the
    context-bucketed graphs) against the graph of an arena as long as the context."""

    context: int
    num_reqs: int
    capacity: HostGpu
    ideal: HostGpu
    bucketed: HostGpu | None = None
    #: Graph pool memory (bytes) of the capacity-wide graph and of every context bucket's.
    capacity_pool_bytes: int = 0
    bucketed_pool_bytes: int | None = None

    @property
    def gpu_ratio(self) -> float:
        """Capacity-wide GPU time over the ``C``-wide graph's (1.0: no cost of capacity)."""
        return self.capacity.over(self.ideal)[1]

    @property
    def bucketed_ratio(self) -> float | None:
        """The context-bucketed graph's GPU time over the ``C``-wide graph's."""
        return None if self.bucketed is None else self.bucketed.over(self.ideal)[1]


@dataclass(slots=True)
class ContextReport:
    env: dict
    preset: str
    capacity: int
    consumer: str
    rows: list[ContextRow] = field(default_factory=list)

    def table(self) -> str:
        """The rows as text, medians in µs."""
        lines = [f"{self.preset}, graphs captured for max_model_len {self.capacity:,} vs for "
                 f"the context, {self.consumer}, on {self.env['device']}",
                 f"{'context':>9} {'reqs':>5} | {'capacity GPU':>12} {'host':>6} | "
                 f"{'bucketed GPU':>12} {'host':>6} | {'ideal GPU':>9} {'host':>6} | "
                 f"{'cap x':>6} {'bkt x':>6} | {'pool MiB':>7} {'bkt':>7}"]
        for r in self.rows:
            c, x = r.capacity, r.ideal
            # No bucketed graph at the capacity itself: its columns read nan.
            b = ((r.bucketed.gpu_us.median, r.bucketed.host_us.median, r.bucketed_pool_bytes)
                 if r.bucketed else (float("nan"),) * 3)
            lines.append(
                f"{r.context:>9,} {r.num_reqs:>5} | {c.gpu_us.median:>12.1f} "
                f"{c.host_us.median:>6.1f} | {b[0]:>12.1f} {b[1]:>6.1f} | "
                f"{x.gpu_us.median:>9.1f} {x.host_us.median:>6.1f} | "
                f"{r.gpu_ratio:>6.2f} {r.bucketed_ratio or float('nan'):>6.2f} | "
                f"{r.capacity_pool_bytes / 2**20:>7.1f} {b[2] / 2**20:>7.1f}")
        lines.append("(microseconds, medians; ideal = a graph of an arena whose max_model_len "
                     "is the context; cap x, bkt x = capacity-wide, bucketed GPU time / ideal; "
                     "pool MiB: graph pool memory, capacity-wide and all buckets together)")
        return "\n".join(lines)

    def to_json(self) -> str:
        """The report, min and max included, as JSON."""
        return json.dumps({**asdict(self), "gpu_ratios": [r.gpu_ratio for r in self.rows],
                           "bucketed_ratios": [r.bucketed_ratio for r in self.rows]}, indent=1)


def _graph_times(config: ArenaConfig, builders_factory: Callable[[], list],
                 step_factory: Callable[[ArenaConfig], Callable] | None, num_reqs: int,
                 context: int, reps: int, seed: int,
                 buckets: Sequence[int] | None = None) -> tuple[HostGpu, int]:
    """Host and GPU µs per replayed step of ``num_reqs`` decodes, contexts ``<= context``,
    through a graph captured in a new arena of ``config`` (with ``buckets``: through its
    context-bucketed graphs), and the graph pool's bytes."""
    builders = builders_factory()
    arena, inputs = make_arena(config, builders)
    step = step_factory(config) if step_factory is not None else (lambda batch, md: None)
    rng = np.random.default_rng(seed)
    options = GraphOptions(progress=False, time_gpu=True, num_kv_blocks=NUM_KV_BLOCKS)
    runner = (GraphManager(arena, inputs, builders, step, options) if buckets is None
              else ContextGraphs(arena, inputs, builders, step, contexts=buckets,
                                 options=options))
    with runner:
        runner.capture([num_reqs * config.next_n], buckets=())
        batch = random_uniform_decode(inputs, num_reqs, rng, max_seq_len=context,
                                      short_fraction=0.0, invalid_fraction=0.0)
        args = (batch.query_lens, batch.seq_lens, batch.slot_mapping)
        for _ in range(10):
            assert runner.run(*args).mode == "graph"
        host, gpu = step_times_us(runner, args, None, reps)
        return HostGpu.of(host, gpu), runner.pool_bytes


def run_context_bench(preset: str, contexts: Sequence[int], capacity: int,
                      builders_factory: Callable[[], list],
                      step_factory: Callable[[ArenaConfig], Callable] | None, *,
                      batches: Sequence[int] = (32,), reps: int = 200, seed: int = 0,
                      consumer_name: str = "metadata only",
                      progress: bool = False) -> ContextReport:
    """Time, per context ``C`` in ``contexts`` and batch size (requests), the decode step
    replayed through a graph of ``preset`` captured for ``max_model_len = capacity``,
    through the same arena's context-bucketed graphs (a bucket at ``C``), and through a
    graph of an arena with ``max_model_len = C``; ``progress``: a bar over the pairs."""
    report = ContextReport(environment(), preset, capacity, consumer_name)
    pairs = [(context, k) for context in sorted(contexts) for k in batches]
    for context, k in tqdm(pairs, desc="context bench", unit="context", disable=not progress,
                           leave=False):
        same = (builders_factory, step_factory, k, context, reps, seed)
        wide = ArenaConfig.preset(preset, max_model_len=capacity)
        times, pool = _graph_times(wide, *same)
        ideal, _ = _graph_times(ArenaConfig.preset(preset, max_model_len=context), *same)
        bucketed, bucketed_pool = (_graph_times(wide, *same, buckets=[context])
                                   if context < capacity else (None, None))
        report.rows.append(ContextRow(context, k, times, ideal, bucketed, pool, bucketed_pool))
    return report
