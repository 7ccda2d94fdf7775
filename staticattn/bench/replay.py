"""Replay-latency benchmark: per captured size, one graph replay vs the same builders
(and step) run eagerly, plus a one-kernel graph as the floor.

For each size ``s`` (tokens; ``s / next_n`` requests, all real, long random sequences):

* host time of one step: wall clock of ``GraphManager.run`` (validation, staging and
  ``replay()``), measured after a device sync so no wait on earlier work is counted;
* GPU time of one step: CUDA events around the replay;
* the same for the eager path (``run(..., eager=EagerBuild.REFERENCE)``: the same
  validation and staging,
  then every builder's ``build`` and the step, launched one kernel at a time);
* node census of the graph; median, min and max over ``reps`` steps.

Absolute numbers are only meaningful from a GPU: the report states device, driver, CUDA,
torch and triton versions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from staticattn.arena import ArenaConfig
from staticattn.bench.bench_report import BenchReport, BenchRow, HostGpu, Stat, environment
from staticattn.bench.floor import host_times_us, launch_floor
from staticattn.bench.random_batches import NUM_KV_BLOCKS, random_uniform_decode
from staticattn.builders.contract import make_arena
from staticattn.graphs.manager import GraphManager
from staticattn.graphs.options import EagerBuild, GraphOptions, StagingGuard

__all__ = ["in_place_host_us", "run_bench", "step_times_us"]


def step_times_us(gm: GraphManager, args, eager: EagerBuild | None, reps: int,
                  before: Callable[[], None] | None = None,
                  image_spans=None) -> tuple[list, list]:
    """Per step: host wall time of ``GraphManager.run(*args, eager=eager)`` (validation,
    staging and launch, us) and the GPU time of what it launched (CUDA events around the
    replay or the eager kernels, us). Each step starts on an idle device, so neither
    includes waiting for earlier work; host times are taken in a pass without the timing
    events. ``before()``, untimed, runs ahead of each step (ranks lining up); without CUDA
    the GPU times are NaN. ``image_spans`` go to every ``run`` (a vision model's steps).
    """
    kw = {"eager": eager} if image_spans is None else {"eager": eager,
                                                        "image_spans": image_spans}
    gm.time_gpu = False
    host = host_times_us(lambda: gm.run(*args, **kw), reps, before=before)
    if not torch.cuda.is_available():
        return host, [float("nan")] * reps
    gm.time_gpu = True
    gpu = []
    for _ in range(reps):
        if before is not None:
            before()
        torch.cuda.synchronize()
        gpu.append(gm.run(*args, **kw).gpu_us())
    return host, gpu


def run_bench(
    config: ArenaConfig,
    builders_factory: Callable[[], list],
    step_factory: Callable[[ArenaConfig], Callable] | None,
    sizes: Sequence[int],
    *,
    reps: int = 200,
    preset: str = "custom",
    consumer_name: str = "metadata only",
    seed: int = 0,
    progress: bool = True,
    staging_guard: StagingGuard = StagingGuard.STAGING,
) -> BenchReport:
    """Capture ``sizes`` and time graph replay vs the eager path for each (``staging_guard``
    as in :class:`~staticattn.graphs.GraphOptions`)."""
    builders = builders_factory()
    arena, inputs = make_arena(config, builders)
    step = step_factory(config) if step_factory is not None else (lambda batch, md: None)
    report = BenchReport(environment(), preset, config.next_n, consumer_name, launch_floor(),
                         staging_guard=staging_guard.value)
    rng = np.random.default_rng(seed)
    options = GraphOptions(progress=progress, time_gpu=True, staging_guard=staging_guard,
                           num_kv_blocks=NUM_KV_BLOCKS)
    with GraphManager(arena, inputs, builders, step, options) as gm:
        gm.capture(sizes, buckets=())
        for size in sorted(gm.graphs):
            g = gm.graphs[size]
            batch = random_uniform_decode(inputs, g.num_reqs, rng, short_fraction=0.0,
                                          invalid_fraction=0.0)
            args = (batch.query_lens, batch.seq_lens, batch.slot_mapping)
            for _ in range(10):  # warm both paths (eager kernels compile on first use)
                assert gm.run(*args).mode == "graph"
                gm.run(*args, eager=EagerBuild.REFERENCE)
            gh, gg = step_times_us(gm, args, None, reps)
            eh, eg = step_times_us(gm, args, EagerBuild.REFERENCE, reps)
            nodes = g.nodes or {}
            report.rows.append(BenchRow(
                size, g.num_reqs, nodes.get("kernel"), sum(nodes.values()) if nodes else None,
                HostGpu.of(gh, gg), HostGpu.of(eh, eg),
                Stat.of(in_place_host_us(gm, batch.seq_lens, batch.slot_mapping, reps)),
                Stat.of(in_place_host_us(gm, batch.seq_lens, batch.slot_mapping, reps,
                                         validate=False)),
                g.capture_s,
            ))
    return report


def in_place_host_us(gm: GraphManager, seq_lens: np.ndarray, slot_mapping: np.ndarray,
                     reps: int, query_lens: np.ndarray | None = None, *,
                     validate: bool = True, image_spans=None) -> list[float]:
    """Host time of a step through the in-place API: ``begin_step()`` and ``launch(k)`` for
    a uniform decode step, ``launch(k, t)`` for a step of any composition (``query_lens``
    given; its query starts are written too; a vision model's ``image_spans`` rows too,
    launched with ``num_spans``); the engine's own writes into the views (between the two)
    are not counted. Each step starts on an idle device. ``validate``: the manager's checks
    on (its default) or off, for these steps only.
    ``seq_lens``, ``query_lens``: host ints ``(k,)``; ``slot_mapping``: host ints ``(t,)``;
    ``image_spans``: ``(request, first, last)`` rows; returns ``reps`` host times in
    microseconds."""
    k, num_tokens = seq_lens.shape[0], slot_mapping.shape[0]
    qsl = None if query_lens is None else np.concatenate(([0], np.cumsum(query_lens)))
    counts = (k,) if qsl is None else (k, num_tokens)
    spans = None
    if image_spans is not None:
        spans = np.asarray(image_spans, dtype=np.int32).reshape(-1, 3)
        counts = (k, num_tokens, spans.shape[0])
    host = []
    kept, gm.validate = gm.validate, validate
    try:
        for _ in range(reps + 20):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            views = gm.begin_step()
            t1 = time.perf_counter()
            views.seq_lens[:k] = seq_lens
            views.slot_mapping[:num_tokens] = slot_mapping
            if qsl is not None:
                views.query_start_loc[: k + 1] = qsl
            if spans is not None:
                views.image_spans[: spans.shape[0]] = spans
            t2 = time.perf_counter()
            gm.launch(*counts)
            t3 = time.perf_counter()
            host.append((t1 - t0 + t3 - t2) * 1e6)  # the engine's writes not counted
    finally:
        gm.validate = kept
    return host[20:]
