"""Graph-capture sanity checks: one call, one report, errors and notes.

The checker captures one decode graph per size, largest first, into one shared pool, as the
graph manager does (staging + builders + the user's step), under guards
(:mod:`staticattn.checks.guarded_capture`), then replays each against eager runs:

1. what the guards saw while capturing: host synchronisation (the op named), host reads,
   writes of the step into the arena, random numbers, work on another stream, allocations
   (notes: graph pool memory);
2. address stability: the arena fingerprint, and the metadata views a second
   ``build_decode`` returns, must equal those the graph baked in;
3. every output row rewritten by every replay (two sentinels, one batch);
4. replay == eager on randomized batches, captured with minimal sequence lengths and
   replayed with long ones (a Python branch on data, a size taken from data, a stale
   pointer), under one random seed per batch; the eager twin runs the graph's own body
   (staging kernels, decode builds, step) on the same padded step, so only capturing can
   make them differ (the builds' agreement with the reference builds is the differential
   tests' business); on the first batch that differs, the eager body's calls are compared
   with the captured body's, and the first that differs names what capture froze: a branch,
   a value, a stride or a buffer's address (:mod:`staticattn.checks.frozen`);
   and the replay == the manager's own eager path at the step's own extents (what a step no
   graph holds runs): integer outputs bit for bit, floats within a tolerance; a step that
   depends on what capture fixes (``batch.max_seq_len``...) is an error naming the
   attribute where it can (:mod:`staticattn.checks.extent_probe`);
5. a replay held back on the GPU while the staging writer writes the next step;
6. memory baked into a graph and freed since: tensors the graph reads, and pool memory
   another graph reuses;
7. the node census of each graph, with an optional DOT dump.

Each finding is an error or a note by :data:`staticattn.checks.findings.RULE`; the verdict
is PASS when there is no error.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from staticattn.arena import Arena
from staticattn.bench.random_batches import random_uniform_decode
from staticattn.builders.batch import Batch
from staticattn.builders.contract import MetadataBuilder
from staticattn.checks.check_report import CheckReport, SizeCheck
from staticattn.checks.extent_probe import extent_mismatch
from staticattn.checks.findings import Finding, finding
from staticattn.checks.frozen import frozen_cause
from staticattn.checks.guarded_capture import Captured, PhasedStep, body_calls, guarded_capture
from staticattn.checks.output_compare import same_outputs, snapshot_outputs
from staticattn.checks.probes import (
    RACE_ATTEMPTS,
    RACE_SLEEP_CYCLES,
    freed_and_reused,
    staging_race,
    stale_reads,
    unwritten_outputs,
)
from staticattn.checks.view_addresses import moved_views
from staticattn.checks.watch import ArenaIndex, TensorRef
from staticattn.errors import GraphError
from staticattn.graphs.captured import GraphKind
from staticattn.graphs.capturer import arena_contents_kept
from staticattn.graphs.introspect import dump_dot, node_census
from staticattn.graphs.manager import GraphManager, StepFn
from staticattn.graphs.options import GraphOptions
from staticattn.staging import StepInputs

__all__ = ["check_graph_safety", "CheckReport", "SizeCheck", "StagingWriter"]

#: ``(inputs, seq_lens, slot_mapping)``: writes a uniform decode step into the host staging,
#: as an engine does before a replay (default: ``inputs.stage_uniform_decode``).
StagingWriter = Callable[[StepInputs, np.ndarray, np.ndarray], None]


def check_graph_safety(
    arena: Arena,
    inputs: StepInputs,
    builders: Sequence[MetadataBuilder],
    step: StepFn,
    *,
    sizes: Sequence[int] | None = None,
    num_batches: int = 100,
    seed: int = 0,
    num_kv_blocks: int = 4096,
    dot_dir: str | Path | None = None,
    before_batch: Callable[[int], None] | None = None,
    write_staging: StagingWriter | None = None,
    progress: bool = False,
) -> CheckReport:
    """Check a step for graph safety at each size (tokens); see the module docstring.

    Parameters
    ----------
    arena, inputs : Arena, StepInputs
        A CUDA arena and its inputs (:func:`~staticattn.builders.make_arena`); their
        contents are put back when the check ends.
    builders : sequence of MetadataBuilder
        Bound to ``arena``; their ``build_decode`` runs in the captured graphs.
    step : callable ``(batch, metadata) -> outputs``
        Ours or a user's; outputs (tensors, leading dimension tokens) are compared
        bit for bit between replay and eager runs.
    sizes : sequence of int, optional
        Default: the smallest, a middle and the largest default capture size.
    num_batches : int
        Randomized replays per size (each also run eagerly).
    before_batch : callable ``(i) -> None``, optional
        Called before the i-th randomized batch of every size: the engine's own updates
        between steps (new weights, cache contents...). Replay and eager both see them.
    write_staging : callable ``(inputs, seq_lens, slot_mapping)``, optional
        The engine's staging writer, probed for racing an in-flight replay.
    seed : int
        Seeds the randomized batches and the generator state of every probe.
    num_kv_blocks : int
        Blocks of the KV pool the randomized batches' block tables and slots address.
    dot_dir : str or Path, optional
        A folder for a DOT dump of each captured graph (needs cuda-bindings).
    progress : bool
        A progress bar over the randomized replays (on stderr).

    Returns
    -------
    CheckReport
        Per size: replays, mismatches, node census and findings (errors and notes by
        :data:`~staticattn.checks.findings.RULE`); ``ok`` is the verdict.
    """
    if arena.device.type != "cuda":
        raise GraphError("the graph sanity check needs a CUDA arena")
    phased = PhasedStep(step)
    manager = GraphManager(arena, inputs, builders, phased,
                           GraphOptions(validate=False, progress=False))
    if sizes is None:
        from staticattn.graphs.sizes import default_capture_sizes

        ladder = default_capture_sizes(arena.config)
        sizes = [ladder[0], ladder[len(ladder) // 2], ladder[-1]]
    order = sorted(set(sizes), reverse=True)  # largest first, as the manager captures
    reports = {size: SizeCheck(size) for size in order}
    general: list[Finding] = []
    rng = np.random.default_rng(seed)
    index = ArenaIndex.of(arena)
    fingerprint = arena.fingerprint()
    captured: dict[int, Captured] = {}
    escaped: dict[int, list[TensorRef]] = {}
    try:
        # What the probes stage and build is put back afterwards, as a capture by the
        # graph manager does: the check disturbs nothing an engine may still read.
        with arena_contents_kept(arena):
            for size in order:  # through the manager's own capture path, watched
                c = guarded_capture(manager, phased, size // arena.config.next_n, size,
                                    reports[size], index)
                if c is not None:
                    captured[size] = c
                    # Pool memory that outlived its capture is the graph's to keep; cyclic
                    # garbage (which frozen gc leaves alive) is collected first, between
                    # captures, where a collection frees nothing a graph holds.
                    gc.collect()
                    escaped[size] = [a for a in c.watch.allocations if not a.expired()]
            with torch.random.fork_rng(devices=[arena.device]), tqdm(
                    total=len(captured) * num_batches, desc="check: replays", unit="batch",
                    disable=not progress, leave=False) as bar:
                for size, c in captured.items():
                    _probe_size(manager, c, reports[size], rng, num_kv_blocks, num_batches,
                                dot_dir, before_batch,
                                write_staging or StepInputs.stage_uniform_decode, seed, index,
                                bar.update)
            allocated = {s: c.watch.allocations for s, c in captured.items()}
            for size, message in freed_and_reused(escaped, allocated):
                reports[size].add("pool_reuse", message)
            if arena.fingerprint() != fingerprint:
                changed = [k for k, v in arena.fingerprint().items() if fingerprint.get(k) != v]
                general.append(finding("repointed", f"arena addresses changed: {changed}"))
    finally:
        torch.cuda.synchronize(arena.device)  # no replay may run while its pool is freed
        captured.clear()
        manager.close()
    return CheckReport([reports[s] for s in sorted(reports)], general)


def _probe_size(manager: GraphManager, c: Captured, report: SizeCheck, rng, num_kv_blocks: int,
                num_batches: int, dot_dir, before_batch, write_staging: StagingWriter,
                seed: int, index: ArenaIndex, tick: Callable[[], Any]) -> None:
    cfg, inputs, size = manager.config, manager.inputs, report.size
    num_reqs = size // cfg.next_n
    report.nodes = node_census(c.graph)
    if dot_dir is not None:
        try:
            report.dot_path = str(dump_dot(c.graph, Path(dot_dir) / f"graph_{size}.dot"))
        except Exception as exc:  # an optional extra: its failure says nothing of the step
            report.add("extra_unavailable", f"DOT dump failed: {type(exc).__name__}: {exc}")
    again = {b.name: b.build_decode(Batch.for_decode_capture(inputs, num_reqs))
             for b in manager.builders}
    moved = moved_views(c.metadata, again, held=index.holds)
    if moved:
        report.add("repointed", "build_decode returned different views than at capture for "
                   + ", ".join(moved))

    def stage(s) -> None:
        inputs.stage(s.query_lens, s.seq_lens, s.slot_mapping,
                            num_reqs_padded=num_reqs, num_tokens_padded=size)

    first = random_uniform_decode(inputs, num_reqs, rng, num_kv_blocks=num_kv_blocks)
    stage(first)
    unwritten = unwritten_outputs(c.outputs, int(first.slot_mapping.shape[0]), c.graph.replay,
                                  seed)
    if unwritten:
        report.add("output_not_rewritten", "; ".join(unwritten))
    stale: set[str] = set()
    extents: list[str] = []
    frozen: tuple[str, str] | None = None
    captured_batch = Batch.for_decode_capture(inputs, num_reqs, manager.capturer.context_len)
    for i in range(num_batches):
        if before_batch is not None:
            before_batch(i)
        stale.update(stale_reads(c.watch.external.values()))
        k = int(rng.integers(1, num_reqs + 1))
        s = random_uniform_decode(inputs, k, rng, num_kv_blocks=num_kv_blocks)
        n_tok = int(s.slot_mapping.shape[0])
        stage(s)
        torch.cuda.manual_seed(seed + i)
        c.graph.replay()
        replayed = snapshot_outputs(c.outputs, n_tok)
        torch.cuda.manual_seed(seed + i)
        eager = snapshot_outputs(_eager(manager, num_reqs, size), n_tok)
        report.replays += 1
        if not same_outputs(replayed, eager):
            report.mismatches += 1
            if report.mismatches == 1:  # what capture froze: the first call that differs
                torch.cuda.manual_seed(seed + i)
                _, calls = body_calls(manager, num_reqs, size, index)
                frozen = frozen_cause(c.watch.calls, calls)
        torch.cuda.manual_seed(seed + i)
        extent = extent_mismatch(manager, captured_batch, replayed, s.query_lens, s.seq_lens,
                                 s.slot_mapping)
        if extent is not None:
            extents.append(extent)
        tick()
    if extents:
        report.add("extent_mismatch", f"in {len(extents)}/{report.replays} randomized "
                   f"batches; first: {extents[0]}")
    if report.mismatches:
        report.add("replay_mismatch",
                   f"replay != eager in {report.mismatches}/{report.replays} randomized "
                   "batches (captured with minimal sequence lengths, replayed with long ones): "
                   "a value baked in at capture, e.g. a Python branch or a size taken from "
                   "data, or a tensor the graph reads that was re-created")
        if frozen is not None:
            report.add(*frozen)
    stale.update(stale_reads(c.watch.external.values()))
    if stale:
        report.add("stale_pointer", "; ".join(sorted(stale)[:5]))
    if report.mismatches or stale:
        return  # the race probe needs replay == eager to tell a race apart
    race = _race_probe(manager, c, rng, num_kv_blocks, write_staging, seed)
    if race is _INCONCLUSIVE:
        report.add("race_probe_inconclusive",
                   f"{RACE_ATTEMPTS} attempts, the longest holding the replay "
                   f"{RACE_SLEEP_CYCLES << (RACE_ATTEMPTS - 1)} GPU cycles")
    elif race:
        report.add("staging_race", race)


#: What :func:`_race_probe` returns when no attempt could tell.
_INCONCLUSIVE = "inconclusive"


def _race_probe(manager: GraphManager, c: Captured, rng, num_kv_blocks: int,
                write_staging: StagingWriter, seed: int) -> str | None:
    """One step replayed behind a GPU sleep while the writer stages the next (a minimal
    one: every sequence ``next_n`` long, no slot written; no device work on the host).

    Returns the finding, None, or :data:`_INCONCLUSIVE`. An attempt decides when the host
    finished writing while the GPU was still held, or when the writer waited for the
    staging event (``inputs.wait_staging_free``, watched here); otherwise the host may
    have been starved by other work past the hold, and the next attempt doubles it."""
    cfg, inputs = manager.config, manager.inputs
    num_reqs = c.size // cfg.next_n
    s = random_uniform_decode(inputs, num_reqs, rng, num_kv_blocks=num_kv_blocks)
    n_tok = int(s.slot_mapping.shape[0])
    inputs.stage(s.query_lens, s.seq_lens, s.slot_mapping)
    torch.cuda.manual_seed(seed)
    expected = snapshot_outputs(_eager(manager, num_reqs, c.size), n_tok)
    short = np.full(num_reqs, cfg.next_n, dtype=np.int32)
    none = np.full(n_tok, -1, dtype=np.int64)
    waited: list[bool] = []

    def watched_wait() -> None:
        waited.append(True)
        type(inputs).wait_staging_free(inputs)

    inputs.wait_staging_free = watched_wait  # this instance only, for the probe
    try:
        for attempt in range(RACE_ATTEMPTS):
            write_staging(inputs, s.seq_lens, s.slot_mapping)
            torch.cuda.synchronize()
            torch.cuda.manual_seed(seed)
            waited.clear()
            finding, in_time = staging_race(
                lambda: write_staging(inputs, short, none), c.graph.replay, c.outputs,
                expected, n_tok, cycles=RACE_SLEEP_CYCLES << attempt)
            if finding or in_time or waited:
                return finding
    finally:
        del inputs.wait_staging_free
    return _INCONCLUSIVE


def _eager(manager: GraphManager, num_reqs: int, size: int) -> Any:
    """The graph's body run eagerly on the staged step: the same staging kernels, decode
    builds and step, on the same padded batch, so a difference from the replay can only
    come from capturing (a value baked in, a host read, a stale pointer...), and float
    consumers whose schedule depends on the batch's extent compare bit for bit."""
    outputs, _ = manager.capturer.body(GraphKind.DECODE, num_reqs, size)
    return outputs
