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
from staticattn.bench.bench_report import Stat, environment
from staticattn.bench.random_batches import NUM_KV_BLOCKS, random_uniform_decode
from staticattn.bench.replay import step_times_us
from staticattn.builders.contract import make_arena
from staticattn.graphs.contexts import ContextGraphs
from staticattn.graphs.manager import GraphManager
from staticattn.graphs.options import GraphOptions

__all__ = ["ContextReport", "ContextRow", "run_context_bench"]


@dataclass(slots=True)
class ContextRow:
    """One context and batch size: the capacity-wide graph against the ``C``-wide one."""

    context: int
    num_reqs: int
    capacity_gpu_us: Stat
    capacity_host_us: Stat
    context_gpu_us: Stat
    context_host_us: Stat
    bucketed_gpu_us: Stat | None = None
    bucketed_host_us: Stat | None = None
    #: Graph pool memory (bytes) of the capacity-wide graph and of every context bucket's.
    capacity_pool_bytes: int = 0
    bucketed_pool_bytes: int | None = None

    @property
    def gpu_ratio(self) -> float:
        """Capacity-wide GPU time over the ``C``-wide graph's (1.0: no cost of capacity)."""
        return self.capacity_gpu_us.median / self.context_gpu_us.median

    @property
    def bucketed_ratio(self) -> float | None:
        """The context-bucketed graph's GPU time over the ``C``-wide graph's."""
        if self.bucketed_gpu_us is None:
            return None
        return self.bucketed_gpu_us.median / self.context_gpu_us.median


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
            b_gpu = r.bucketed_gpu_us.median if r.bucketed_gpu_us else float("nan")
            b_host = r.bucketed_host_us.median if r.bucketed_host_us else float("nan")
            lines.append(
                f"{r.context:>9,} {r.num_reqs:>5} | {r.capacity_gpu_us.median:>12.1f} "
                f"{r.capacity_host_us.median:>6.1f} | {b_gpu:>12.1f} {b_host:>6.1f} | "
                f"{r.context_gpu_us.median:>9.1f} {r.context_host_us.median:>6.1f} | "
                f"{r.gpu_ratio:>6.2f} {r.bucketed_ratio or float('nan'):>6.2f} | "
                f"{r.capacity_pool_bytes / 2**20:>7.1f} "
                f"{(r.bucketed_pool_bytes or float('nan')) / 2**20:>7.1f}")
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
                 buckets: Sequence[int] | None = None) -> tuple[list, list, int]:
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
        return host, gpu, runner.pool_bytes


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
        ch, cg, cpool = _graph_times(ArenaConfig.preset(preset, max_model_len=capacity),
                                     *same)
        xh, xg, _ = _graph_times(ArenaConfig.preset(preset, max_model_len=context), *same)
        bh = bg = bpool = None
        if context < capacity:
            bh, bg, bpool = _graph_times(ArenaConfig.preset(preset, max_model_len=capacity),
                                         *same, buckets=[context])
        report.rows.append(ContextRow(
            context, k, Stat.of(cg), Stat.of(ch), Stat.of(xg), Stat.of(xh),
            None if bg is None else Stat.of(bg), None if bh is None else Stat.of(bh),
            cpool, bpool))
    return report
