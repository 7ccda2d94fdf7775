"""A replay against the manager's own eager path at the step's own extents.

A graph's batch carries what capture fixed: its padded request and token counts and its
bounds (``max_seq_len`` is the capture bound, ``context_len`` or ``max_model_len``;
``max_query_len`` the bucket's). A step no graph holds runs eagerly with the step's own:
its counts through the graph builds (``GraphManager.run(..., eager=EagerBuild.GRAPH)``,
whose batch keeps the capacities as maxima), its counts and maxima through the reference
builds (``EagerBuild.REFERENCE``); both are compared. A step whose outputs depend on a
capture-time extent gives one result when replayed and another when the same step runs
eagerly; comparing the replay with the graph's own body on the same padded batch (the
checker's ``replay_mismatch``) cannot see it, since both read the same extents.

:func:`extent_mismatch` compares the two: integer and boolean outputs bit for bit, floating
ones within their dtype's :data:`FLOAT_TOLERANCES` (the eager path's kernels may reduce in
another order at other extents: FlashMLA splits a sequence's keys by the batch's size, and a
bfloat16 output then moves by one unit in the last place, 2**-7 at magnitudes in [1, 2)).
On a difference it names the batch attribute the step depends on where it can: the step
is run again on the eager metadata with each static attribute that differs set to its
capture-time value, and the one that brings the outputs back to the replay's is named.

Example: a step returning ``positions + batch.max_seq_len`` replays ``+ 4096`` (a graph of
``max_model_len`` 4096) and runs eagerly ``+ 300`` (the step's longest sequence): "the step
reads batch.max_seq_len (4096 at capture, 300 for this step)".
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from staticattn.builders.batch import Batch
from staticattn.checks.output_compare import snapshot_outputs
from staticattn.graphs.captured import GraphKind
from staticattn.graphs.manager import GraphManager
from staticattn.graphs.options import EagerBuild
from staticattn.graphs.sizes import (
    bucket_requests,
    default_capture_sizes,
    default_mixed_buckets,
)

__all__ = ["FLOAT_TOLERANCES", "EXTENT_FIELDS", "emulated_replay", "extent_mismatch",
           "float_tolerance", "outputs_differ"]

#: ``dtype -> (rtol, atol)`` of floating outputs between a replay and the eager path at
#: other extents: two units in the last place for the half types (bfloat16's unit is
#: 2**-8 relative), 1e-3 for the wider ones. A step that reads a capture-time extent moves
#: its outputs by far more than a reduction order does.
FLOAT_TOLERANCES = {
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float16: (2e-3, 1e-3),
}
#: Every other floating dtype (float32, float64, complex).
WIDE_TOLERANCE = (1e-3, 1e-3)


def float_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """``(rtol, atol)`` for floating outputs of ``dtype``."""
    return FLOAT_TOLERANCES.get(dtype, WIDE_TOLERANCE)
#: The batch's static attributes a graph fixes at capture: what :func:`extent_mismatch`
#: may name.
EXTENT_FIELDS = ("max_seq_len", "max_query_len", "num_reqs", "num_actual_tokens")


def outputs_differ(replayed: list[torch.Tensor], eager: list[torch.Tensor]) -> str | None:
    """The first difference between two :func:`~staticattn.checks.output_compare.snapshot_outputs`
    (lists of tensors of any dtype and shape, leading dimension tokens: integer and boolean
    tensors compared bit for bit, floating ones within the tolerances), or None."""
    if len(replayed) != len(eager):
        return f"{len(replayed)} outputs replayed, {len(eager)} eagerly"
    for i, (a, b) in enumerate(zip(replayed, eager)):
        if a.shape != b.shape or a.dtype != b.dtype:
            return (f"output {i}: {tuple(a.shape)} {a.dtype} replayed, {tuple(b.shape)} "
                    f"{b.dtype} eagerly")
        if a.is_floating_point() or a.is_complex():
            rtol, atol = float_tolerance(a.dtype)
            if not torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
                worst = (a.double() - b.double()).abs().nan_to_num(0).max().item()
                return (f"output {i} ({a.dtype}): off by up to {worst:.3g}, past rtol "
                        f"{rtol} / atol {atol}")
        elif not torch.equal(a, b):
            row = int((a != b).reshape(a.shape[0], -1).any(1).nonzero()[0]) if a.dim() else 0
            return f"output {i} ({a.dtype}): row {row} differs"
    return None


def extent_mismatch(manager: GraphManager, capture_batch: Batch,
                    replayed: list[torch.Tensor], query_lens: np.ndarray,
                    seq_lens: np.ndarray, slot_mapping: np.ndarray) -> str | None:
    """Run the step eagerly at its own extents and compare with ``replayed`` (the replay's
    outputs, first ``num_tokens`` rows); None when they agree, else what differs and, where
    it can be told, the attribute of ``capture_batch`` (the graph's) the step reads.

    ``query_lens``, ``seq_lens`` host ints ``(num_reqs,)``; ``slot_mapping`` int64
    ``(num_tokens,)``. Overwrites the staging and the metadata views: call it between
    steps."""
    n_tok = int(np.asarray(slot_mapping).shape[0])
    # Each build starts from the generator state the replay started from (fork_rng restores
    # it after each): a step that draws from the default generator then draws the same
    # numbers on every path.
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    for build in (EagerBuild.GRAPH, EagerBuild.REFERENCE):
        with torch.random.fork_rng(devices=devices):
            res = manager.run(query_lens, seq_lens, slot_mapping, eager=build)
            diff = outputs_differ(replayed, snapshot_outputs(res.outputs, n_tok))
        if diff is not None:
            break
    else:
        return None
    what = f"replay != the eager step at its own extents ({build.value} builds: {diff})"
    blamed = _blame(manager, capture_batch, replayed, query_lens, seq_lens, slot_mapping)
    if blamed is None:
        return f"{what}: the step depends on something capture fixes"
    name, captured, own = blamed
    return f"{what}: the step reads batch.{name} ({captured} at capture, {own} for this step)"


def _blame(manager: GraphManager, capture_batch: Batch, replayed: list[torch.Tensor],
           q, s, slots) -> tuple[str, int, int] | None:
    """The extent field whose capture-time value, alone put into the eager batch, gives the
    replay's outputs: ``(name, at capture, this step's)``, or None."""
    inputs, n_tok = manager.inputs, int(np.asarray(slots).shape[0])
    counts = inputs.stage(q, s, slots)
    inputs.copy_to_device(counts.num_reqs_padded, counts.num_tokens_padded)
    batch = Batch.from_staged(inputs, counts)
    metadata = {b.name: b.build(batch) for b in manager.builders}
    for name in EXTENT_FIELDS:
        captured, own = getattr(capture_batch, name), getattr(batch, name)
        if captured == own:
            continue
        try:
            out = manager.step(dataclasses.replace(batch, **{name: captured}), metadata)
        except Exception:  # the step could not run on the mixed batch: not this field
            continue
        if outputs_differ(replayed, snapshot_outputs(out, n_tok)) is None:
            return name, captured, own
    return None


def emulated_replay(manager: GraphManager, query_lens: np.ndarray, seq_lens: np.ndarray,
                    slot_mapping: np.ndarray) -> tuple[Batch, list[torch.Tensor]] | None:
    """What a replay of the graph that would hold the step computes, on any device: the
    graph's body (staging kernels, builds at the capture extents, the step) run eagerly on
    the staged step, for the smallest default decode size (a uniform decode step) or token
    bucket that holds it. ``query_lens``, ``seq_lens`` host ints ``(num_reqs,)``,
    ``slot_mapping`` int64 ``(num_tokens,)``. Returns ``(the graph's batch, its outputs'
    first num_tokens rows as tensors)``, or None when no default graph holds the step."""
    cfg, inputs = manager.config, manager.inputs
    q, s = np.asarray(query_lens), np.asarray(seq_lens)
    k, n_tok, n = int(q.shape[0]), int(np.asarray(slot_mapping).shape[0]), cfg.next_n
    if k and (q == n).all():
        size = next((z for z in default_capture_sizes(cfg) if z >= n_tok), None)
        if size is not None:
            inputs.stage_uniform_decode(s, slot_mapping)
            outputs, _ = manager.capturer.body(GraphKind.DECODE, size // n, size)
            batch = Batch.for_decode_capture(inputs, size // n, manager.capturer.context_len)
            return batch, snapshot_outputs(outputs, n_tok)
    size = next((t for t in default_mixed_buckets(cfg)
                 if t >= n_tok and bucket_requests(cfg, t) >= k), None)
    if size is None:
        return None
    inputs.stage_step(q, s, slot_mapping)
    outputs, _ = manager.capturer.body(GraphKind.MIXED, bucket_requests(cfg, size), size)
    batch = Batch.for_mixed_capture(inputs, bucket_requests(cfg, size), size)
    return batch, snapshot_outputs(outputs, n_tok)
