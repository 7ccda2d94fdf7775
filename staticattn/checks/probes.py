"""Replay probes: what can only be seen by running a captured graph.

* :func:`unwritten_outputs` -- does every replay rewrite every output row of the step?
* :func:`staging_race` -- does the staging writer wait for the in-flight replay?
* :func:`freed_and_reused` / :func:`stale_reads` -- memory the graph baked in that Python
  freed afterwards (and, for pool memory, handed to another graph).

Each returns messages; the checker turns them into findings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch.utils._pytree import tree_flatten

from staticattn.checks.output_compare import same_outputs, snapshot_outputs
from staticattn.checks.watch import TensorRef

__all__ = ["RACE_ATTEMPTS", "RACE_SLEEP_CYCLES", "freed_and_reused", "sentinels",
           "stale_reads", "staging_race",
           "unwritten_mask", "unwritten_outputs"]

#: GPU cycles the race probe holds a replay back for (~20 ms at ~2 GHz): far longer than the
#: host needs to write the next step's staging, unless the host is starved; an inconclusive
#: attempt is retried with a longer hold (``RACE_ATTEMPTS``, each twice the last).
RACE_SLEEP_CYCLES = 40_000_000
RACE_ATTEMPTS = 3


def sentinels(dtype: torch.dtype) -> tuple[int, int]:
    """Two fill values that differ in ``dtype`` (bool has only two)."""
    return (False, True) if dtype == torch.bool else (1, 2)


def unwritten_mask(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """Elements holding the first sentinel after the first replay and the second after the
    second: never written (a deterministic replay of one batch writes the same value twice).

    first, second : the same output after a replay that followed a fill with
    ``sentinels(dtype)[0]``, respectively ``[1]``; any shape and dtype.
    """
    a, b = sentinels(first.dtype)
    return (first == a) & (second == b)


def unwritten_outputs(outputs, num_tokens: int, replay: Callable[[], None],
                      seed: int = 0) -> list[str]:
    """Fill the first ``num_tokens`` rows of every output with one sentinel, replay, then
    with another, replay; name the outputs some of whose elements kept both. The rows are
    left as the second replay wrote them (unwritten elements hold the second sentinel).

    Both replays start from the same generator state (``seed``), so an output drawn from
    random numbers is written the same twice, not mistaken for one left unwritten; the
    caller's generator state is restored afterwards.
    """
    flat = [t for t in tree_flatten(outputs)[0] if isinstance(t, torch.Tensor)]
    rows = [t[:num_tokens] if t.dim() else t for t in flat]  # a 0-dim output has no rows
    found = []
    snaps: list[list[torch.Tensor]] = []
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        for k in range(2):
            for r in rows:
                r.fill_(sentinels(r.dtype)[k])
            torch.random.default_generator.manual_seed(seed)
            if devices:
                torch.cuda.manual_seed(seed)  # the current device's, which fork_rng restores
            replay()
            snaps.append(snapshot_outputs(rows))
    for i, (first, second) in enumerate(zip(*snaps)):
        stale = int(unwritten_mask(first, second).sum())
        if stale:
            found.append(f"output {i} ({str(first.dtype).removeprefix('torch.')}"
                         f"{list(flat[i].shape)}): {stale} of {first.numel()} elements of the "
                         f"first {num_tokens} rows are not written by replay")
    return found


def staging_race(write_next: Callable[[], None], replay: Callable[[], None], outputs,
                 expected: list[torch.Tensor], num_tokens: int,
                 cycles: int = RACE_SLEEP_CYCLES) -> tuple[str | None, bool]:
    """Replay a staged step while the GPU is held back (``cycles`` of sleep), let the host
    write the next step through ``write_next`` (the engine's staging writer), then compare
    the replay's outputs with ``expected`` (the eager step it was launched for: tensors of
    any dtype and shape, leading dimension tokens, first ``num_tokens`` rows compared). A
    writer that does not wait for the staging event overwrites the staging before the
    replay reads it.

    Returns ``(finding, in_time)``: the finding when the replay computed another step;
    ``in_time`` when the host had finished writing while the GPU was still held, so that a
    racing write could not have been missed. Otherwise (a writer that waited, or a host
    starved by other work) the attempt alone proves nothing: the caller tells the two
    apart or retries with a longer hold."""
    torch.cuda._sleep(cycles)
    held = torch.cuda.Event()
    held.record()
    replay()
    write_next()
    in_time = not held.query()
    torch.cuda.synchronize()
    if same_outputs(snapshot_outputs(outputs, num_tokens), expected):
        return None, in_time
    return ("the replay computed another step than the one staged when it was launched: "
            "the staging writer rewrote the host staging while the replay had not read it "
            "yet (wait for the staging event first: begin_step() / "
            "inputs.wait_staging_free())"), True


def stale_reads(external: Iterable[TensorRef]) -> list[str]:
    """Tensors the graph reads (outside the arena and its pool) that have been freed."""
    return [f"{r.describe()} was freed; the graph still reads its old address"
            for r in external if r.expired()]


def freed_and_reused(escaped: dict[int, list[TensorRef]],
                     allocated: dict[int, list[TensorRef]]) -> list[tuple[int, str]]:
    """Pool memory that outlived the capture of graph ``a`` (``escaped[a]``), freed since,
    and overlapped by an allocation of another graph ``b`` captured later
    (``allocated[b]``). Sizes are keyed by capture order; returns ``(a, message)``."""
    order = list(escaped)
    found = []
    for i, a in enumerate(order):
        for r in escaped[a]:
            if not r.expired():
                continue
            users = [b for b in order[i + 1:] for s in allocated.get(b, [])
                     if s.ptr < r.ptr + r.nbytes and r.ptr < s.ptr + s.nbytes]
            if users:
                found.append((a, f"{r.describe()} was freed after capture and reused by the "
                                 f"graph of {users[0]} tokens; replaying this graph writes "
                                 "(or reads) that graph's memory"))
    return found
