"""Graph-capture sanity checks: one call, one report, loud failures.

For each size the checker captures the step (staging + builders + the user's step) under
guards and then replays it against eager runs:

1. host synchronisation inside capture (sync-debug mode "error"; the op that raised is
   named) and any fresh tensor created on the captured path (named by op);
2. address stability: the arena fingerprint, and the metadata views a second
   ``build_decode`` returns, must equal those the graph baked in;
3. replay == eager on randomized batches, captured with minimal sequence lengths and
   replayed with long ones (the classic stale-specialisation bug);
4. the node census of the raw graph (kernels, memcpys, memsets, host nodes, events...),
   with an optional DOT dump.
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from staticattn.arena import Arena
from staticattn.bench.random_batches import random_uniform_decode
from staticattn.builders.base import MetadataBuilder
from staticattn.builders.batch import Batch
from staticattn.checks.guards import FreshTensorWatch, sync_guard
from staticattn.checks.outputs import same_outputs, snapshot_outputs
from staticattn.errors import GraphError
from staticattn.graphs.capture import capture
from staticattn.graphs.introspect import dump_dot, node_census
from staticattn.graphs.manager import GraphManager, StepFn
from staticattn.staging import StepInputs

__all__ = ["check_graph_safety", "CheckReport", "SizeCheck"]


@dataclass(slots=True)
class SizeCheck:
    """Findings for one captured size."""

    size: int
    failures: list[str] = field(default_factory=list)
    nodes: dict[str, int] | None = None
    replays: int = 0
    mismatches: int = 0
    dot_path: str | None = None


@dataclass(slots=True)
class CheckReport:
    sizes: list[SizeCheck]

    @property
    def ok(self) -> bool:
        return all(not s.failures for s in self.sizes)

    @property
    def failures(self) -> list[str]:
        return [f"size {s.size}: {f}" for s in self.sizes for f in s.failures]

    def __str__(self) -> str:
        lines = [f"{'size':>6} {'replays':>8} {'mismatch':>9} {'kernels':>8} {'nodes':>6}  verdict"]
        for s in self.sizes:
            n = s.nodes or {}
            lines.append(
                f"{s.size:>6} {s.replays:>8} {s.mismatches:>9} {n.get('kernel', '-'):>8} "
                f"{sum(n.values()) if n else '-':>6}  {'ok' if not s.failures else 'FAIL'}"
            )
            lines += [f"       - {f}" for f in s.failures]
            if s.nodes:
                lines.append("       nodes: " + ", ".join(f"{k}={v}" for k, v in sorted(n.items())))
        lines.append("PASS" if self.ok else f"FAIL ({len(self.failures)} problems)")
        return "\n".join(lines)

    def raise_on_failure(self) -> None:
        if not self.ok:
            raise GraphError("graph sanity check failed:\n" + "\n".join(self.failures))


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
) -> CheckReport:
    """Check a step for graph safety at each size (tokens); see the module docstring.

    Parameters
    ----------
    step : callable ``(batch, metadata) -> outputs``
        Ours or a user's; outputs (tensors, leading dimension tokens) are compared
        bit for bit between replay and eager runs.
    sizes : sequence of int, optional
        Default: the smallest, a middle and the largest default capture size.
    num_batches : int
        Randomized replays per size (each also run eagerly).
    """
    if arena.device.type != "cuda":
        raise GraphError("the graph sanity check needs a CUDA arena")
    manager = GraphManager(arena, inputs, builders, step, validate=False, progress=False)
    if sizes is None:
        from staticattn.graphs.sizes import default_capture_sizes

        ladder = default_capture_sizes(arena.config)
        sizes = sorted({ladder[0], ladder[len(ladder) // 2], ladder[-1]})
    rng = np.random.default_rng(seed)
    results = []
    try:
        for size in sizes:
            results.append(_check_size(manager, size, num_batches, rng, num_kv_blocks, dot_dir))
    finally:
        manager.close()
    return CheckReport(results)


def _check_size(manager: GraphManager, size: int, num_batches: int, rng, num_kv_blocks: int,
                dot_dir) -> SizeCheck:
    report = SizeCheck(size)
    cfg, inputs = manager.config, manager.inputs
    num_reqs = size // cfg.next_n
    fingerprint = manager.arena.fingerprint()
    graph, outputs, metadata = _guarded_capture(manager, num_reqs, size, report)
    if graph is None:
        return report
    report.nodes = node_census(graph)
    if dot_dir is not None:
        try:
            report.dot_path = str(dump_dot(graph, Path(dot_dir) / f"graph_{size}.dot"))
        except Exception as exc:  # the census and the DOT dump are optional extras
            report.failures.append(f"DOT dump failed: {exc}")
    again = {b.name: b.build_decode(Batch.for_decode_capture(inputs, num_reqs))
             for b in manager.builders}
    moved = _moved_views(metadata, again)
    if moved:
        report.failures.append(
            "re-pointed buffer: build_decode returned different views than at capture for "
            + ", ".join(moved)
        )
    for _ in range(num_batches):
        k = int(rng.integers(1, num_reqs + 1))
        s = random_uniform_decode(inputs, k, rng, num_kv_blocks=num_kv_blocks)
        inputs.stage(s.query_lens, s.seq_lens, s.slot_mapping, num_reqs_padded=num_reqs,
                     num_tokens_padded=size)
        graph.replay()
        n_tok = int(s.slot_mapping.shape[0])
        replayed = snapshot_outputs(outputs, n_tok)
        eager = snapshot_outputs(manager.run_eager(s.query_lens, s.seq_lens, s.slot_mapping),
                                 n_tok)
        report.replays += 1
        if not same_outputs(replayed, eager):
            report.mismatches += 1
    if report.mismatches:
        report.failures.append(
            f"replay != eager in {report.mismatches}/{report.replays} randomized batches "
            "(captured with minimal sequence lengths, replayed with long ones): a value baked "
            "in at capture, e.g. a Python branch or a size taken from data"
        )
    if manager.arena.fingerprint() != fingerprint:
        changed = [k for k, v in manager.arena.fingerprint().items() if fingerprint.get(k) != v]
        report.failures.append(f"arena addresses changed: {changed}")
    return report


def _guarded_capture(manager: GraphManager, num_reqs: int, size: int, report: SizeCheck):
    inputs = manager.inputs
    stream = torch.cuda.Stream(manager.arena.device)
    try:
        manager.warm_up(num_reqs, size, stream)
    except Exception as exc:
        report.failures.append(f"the step fails even eagerly: {exc!r}")
        return None, None, None
    baseline = _capture_allocations(
        lambda: inputs.copy_to_device(num_reqs, size, uniform=True), stream)
    watch = FreshTensorWatch()

    def guarded_body():
        # The guards go inside the capture: entering a capture synchronises on purpose.
        with sync_guard(), watch:
            return manager.body("decode", num_reqs, size)

    allocs0 = _allocations()
    try:
        graph, (outputs, metadata) = capture(guarded_body, stream, error_mode="thread_local")
    except Exception as exc:
        op = watch.last_op or "unknown op"
        report.failures.append(
            f"host synchronisation (or another capture-breaking call) inside capture at op "
            f"'{op}'{_SYNC_OPS.get(op, '')}: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}"
        )
        report.failures.append("traceback tail: " + traceback.format_exc().splitlines()[-1])
        torch.cuda.synchronize()
        return None, None, None
    allocs = _allocations() - allocs0 - baseline
    if watch.fresh:
        report.failures.append(
            "fresh tensors created on the captured path: "
            + ", ".join(f"{op} x{c}" for op, c in sorted(watch.fresh.items()))
        )
    elif allocs > 0:
        report.failures.append(
            f"{allocs} allocations inside capture beyond the staging-only baseline, by no "
            "aten op (an extension or library allocating through the caching allocator)"
        )
    torch.cuda.synchronize()
    return graph, outputs, metadata


#: aten ops that wait on the device, and the Python spelling users know them by.
_SYNC_OPS = {
    "_local_scalar_dense": " (.item() / int() / float() / bool() of a CUDA tensor)",
    "nonzero": " (nonzero / boolean-mask indexing / torch.where with one argument)",
    "_to_copy": " (.cpu() / .tolist() / .to('cpu'))",
    "copy_": " (a copy to host memory)",
    "is_nonzero": " (bool() of a CUDA tensor, e.g. `if t.any():`)",
    "repeat_interleave": " (repeat_interleave without output_size)",
    "unique": " (torch.unique)",
}


def _allocations() -> int:
    return torch.cuda.memory_stats().get("allocation.all.allocated", 0)


def _capture_allocations(fn, stream) -> int:
    """Allocations the capture machinery itself makes around ``fn`` (subtracted as noise)."""
    before = _allocations()
    capture(fn, stream)
    return _allocations() - before


def _tensors(obj: Any) -> list[tuple[str, torch.Tensor]]:
    """(path, tensor) pairs of every tensor reachable in a metadata object."""
    found: list[tuple[str, torch.Tensor]] = []

    def walk(x, path):
        if isinstance(x, torch.Tensor):
            found.append((path, x))
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{path}.{k}")
        elif isinstance(x, list | tuple):
            for i, v in enumerate(x):
                walk(v, f"{path}[{i}]")
        elif hasattr(x, "__dataclass_fields__"):
            for k in x.__dataclass_fields__:
                walk(getattr(x, k), f"{path}.{k}")

    walk(obj, "")
    return found


def _moved_views(first: dict[str, Any], second: dict[str, Any]) -> list[str]:
    a = dict(_tensors(first))
    b = dict(_tensors(second))
    moved = []
    for path in sorted(set(a) | set(b)):
        ta, tb = a.get(path), b.get(path)
        if ta is None or tb is None:
            moved.append(path.lstrip("."))
            continue
        if (ta.data_ptr(), ta.shape, ta.stride()) != (tb.data_ptr(), tb.shape, tb.stride()):
            moved.append(path.lstrip("."))
    return moved
