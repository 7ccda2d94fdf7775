"""What a captured step's cost owes to ``max_model_len``: the same decode steps, every
context at most ``C``, replayed through a graph captured for the capacity (say 1M tokens)
and through one captured for ``max_model_len = C`` -- the graph a context bucket of ``C``
would hold. Their ratio is what serving short contexts under a long context limit costs.

    python -m staticattn bench --context 2048 8192 65536 --max-model-len 1048576
           [--batch 32] [--consumer none|gather|real] [--reps 200] [--json ctx.json]

Per context ``C`` (and batch size): GPU µs per step (CUDA events around the replay) and host
µs of ``run``, medians with min and max over ``reps`` steps, for both graphs, drawn from one
seed so both replay the same lengths. GPU only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from staticattn.arena import ArenaConfig
from staticattn.bench.random_batches import random_uniform_decode
from staticattn.bench.replay import step_times_us
from staticattn.bench.report import Stat, environment
from staticattn.builders.base import make_arena
from staticattn.graphs.manager import GraphManager

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

    @property
    def gpu_ratio(self) -> float:
        """Capacity-wide GPU time over the ``C``-wide graph's (1.0: no cost of capacity)."""
        return self.capacity_gpu_us.median / self.context_gpu_us.median


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
                 f"{'context GPU':>11} {'host':>6} | {'GPU x':>6}"]
        for r in self.rows:
            lines.append(
                f"{r.context:>9,} {r.num_reqs:>5} | {r.capacity_gpu_us.median:>12.1f} "
                f"{r.capacity_host_us.median:>6.1f} | {r.context_gpu_us.median:>11.1f} "
                f"{r.context_host_us.median:>6.1f} | {r.gpu_ratio:>6.2f}")
        lines.append("(microseconds, medians; GPU x = capacity-wide graph / context-wide graph)")
        return "\n".join(lines)

    def to_json(self) -> str:
        """The report, min and max included, as JSON."""
        return json.dumps({**asdict(self), "gpu_ratios": [r.gpu_ratio for r in self.rows]},
                          indent=1)


def _graph_times(config: ArenaConfig, builders_factory: Callable[[], list],
                 step_factory: Callable[[ArenaConfig], Callable] | None, num_reqs: int,
                 context: int, reps: int, seed: int) -> tuple[list, list]:
    """Host and GPU µs per replayed step of ``num_reqs`` decodes, contexts ``<= context``,
    through a graph captured in a new arena of ``config``."""
    builders = builders_factory()
    arena, inputs = make_arena(config, builders)
    step = step_factory(config) if step_factory is not None else (lambda batch, md: None)
    rng = np.random.default_rng(seed)
    with GraphManager(arena, inputs, builders, step, progress=False, time_gpu=True) as gm:
        gm.capture([num_reqs * config.next_n], buckets=())
        batch = random_uniform_decode(inputs, num_reqs, rng, max_seq_len=context,
                                      short_fraction=0.0, invalid_fraction=0.0)
        args = (batch.query_lens, batch.seq_lens, batch.slot_mapping)
        for _ in range(10):
            assert gm.run(*args).mode == "graph"
        return step_times_us(gm, args, False, reps)


def run_context_bench(preset: str, contexts: Sequence[int], capacity: int,
                      builders_factory: Callable[[], list],
                      step_factory: Callable[[ArenaConfig], Callable] | None, *,
                      batches: Sequence[int] = (32,), reps: int = 200, seed: int = 0,
                      consumer_name: str = "metadata only") -> ContextReport:
    """Time, per context ``C`` in ``contexts`` and batch size (requests), the decode step
    replayed through a graph of ``preset`` captured for ``max_model_len = capacity`` and
    through one captured for ``max_model_len = C``."""
    report = ContextReport(environment(), preset, capacity, consumer_name)
    for context in sorted(contexts):
        for k in batches:
            times = [_graph_times(ArenaConfig.preset(preset, max_model_len=cap), builders_factory,
                                  step_factory, k, context, reps, seed)
                     for cap in (capacity, context)]
            (ch, cg), (xh, xg) = times
            report.rows.append(ContextRow(context, k, Stat.of(cg), Stat.of(ch), Stat.of(xg),
                                          Stat.of(xh)))
    return report
