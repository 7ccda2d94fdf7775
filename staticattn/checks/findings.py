"""What the graph sanity checker can find, and whether each finding is an error or a note.

The rule (:data:`RULE`, printed with every report, lists each case): a captured step may
allocate inside the capture. Such memory comes from the graph pool, keeps the address the
graph baked in on every replay and is rewritten by every replay, so it is a *note*: the
output lives in the graph pool and is valid until the next replay of any graph sharing the
pool. Everything that makes a replay differ from the eager step it stands for is an *error*.

:data:`FAULT_KINDS` is the table behind the rule: one entry per kind, its severity and how
it is detected; ``docs/checks.md`` shows the same table with the test of each kind.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

__all__ = ["ERROR", "FAULT_KINDS", "Finding", "FaultKind", "NOTE", "RULE", "finding",
           "severity_of"]

ERROR: Literal["error"] = "error"
NOTE: Literal["note"] = "note"

RULE = (
    "notes: allocations inside the capture whose address is the same on every replay and "
    "whose contents the graph produces (the output lives in the graph pool; valid until the "
    "next replay of any graph sharing the pool), graph-safe random numbers. errors: "
    "anything that makes replay differ from eager: an address that differs between capture "
    "and replay, an output the replay never rewrites, a host read, a sync, a Python branch "
    "on data, memory outside the arena/pool that changes between steps, writes outside the "
    "step's own buffers, staging rewritten under an in-flight replay, random numbers the "
    "replay does not advance, pool memory freed and reused by another graph, work on a "
    "stream outside the capture, outputs that depend on capture-time extents (the replay "
    "differs from the eager step at the step's own extents), and what capture froze of the "
    "step when replay != eager (a branch, a value, a stride, a buffer's address). Verdict: "
    "PASS when there is no error."
)


@dataclass(frozen=True, slots=True)
class FaultKind:
    """One kind of finding: its severity, a title, and how the checker detects it."""

    severity: Literal["error", "note"]
    title: str
    detected_by: str


FAULT_KINDS: dict[str, FaultKind] = {
    "pool_allocation": FaultKind(
        NOTE, "allocation inside the capture (graph pool)",
        "a dispatch mode around the capture: an op's output owns storage none of its "
        "inputs had; the storage is held alive and every output is rewritten by replay"),
    "race_probe_inconclusive": FaultKind(
        NOTE, "the staging-race probe could not tell: the host started writing the next step "
        "only after the GPU had woken, at every hold",
        "a GPU sleep holds the replay back while the host writes; each attempt doubles the "
        "hold"),
    "extra_unavailable": FaultKind(
        NOTE, "an optional extra of the report could not be produced (e.g. the DOT dump)",
        "the extra raised; the check itself is unaffected"),
    "library_allocation": FaultKind(
        NOTE, "allocation inside the capture by no aten op (graph pool)",
        "caching-allocator counters around the capture beyond the staging-only baseline"),
    "graph_safe_rng": FaultKind(
        NOTE, "random numbers from the default CUDA generator (graph-safe)",
        "a seeded op without a generator argument; replay and eager are compared under "
        "one seed"),
    "sync": FaultKind(
        ERROR, "host synchronisation inside capture",
        "sync-debug mode 'error' inside the capture; the dispatch mode names the op"),
    "host_read": FaultKind(
        ERROR, "host memory read by the captured work",
        "a CPU tensor (pinned or pageable) outside the arena's staging passed to an op "
        "that runs on the GPU inside the capture"),
    "replay_mismatch": FaultKind(
        ERROR, "replay != eager",
        "randomized batches replayed after a capture at minimal sequence lengths and "
        "compared bit for bit with the eager step (a Python branch on data, a size taken "
        "from data, a stale pointer)"),
    "frozen_branch": FaultKind(
        ERROR, "replay != eager: a Python branch on the step's data taken at capture",
        "on the first batch whose replay differs from eager, the eager body's calls are "
        "compared with the captured body's: another op, or one issued from another line"),
    "frozen_value": FaultKind(
        ERROR, "replay != eager: a host value computed from the step's data baked in",
        "the same comparison: an op's argument differs (a plan, a count, a bound, a size)"),
    "frozen_stride": FaultKind(
        ERROR, "replay != eager: a stride taken from the step's data baked in",
        "the same comparison: an op gives (or is given) a view of other strides"),
    "frozen_address": FaultKind(
        ERROR, "replay != eager: a buffer handed anew each step (the graph reads the captured "
        "one)", "the same comparison: an op reads a tensor outside the arena at another "
        "address"),
    "extent_mismatch": FaultKind(
        ERROR, "replay != the eager step at its own extents",
        "each randomized batch also runs through the manager's eager path at the step's "
        "own extents (integer outputs bit for bit, floats within a tolerance); the "
        "capture-time batch attribute the step reads is named where it can be told"),
    "output_not_rewritten": FaultKind(
        ERROR, "an output the replay does not rewrite",
        "every output's rows are filled with two sentinels around two replays of one "
        "batch; an element holding both is never written by the graph"),
    "repointed": FaultKind(
        ERROR, "address differs between capture and replay",
        "a second build_decode returns views at other addresses than the graph baked in, "
        "or the arena fingerprint changed"),
    "stale_pointer": FaultKind(
        ERROR, "the graph reads a tensor freed after capture",
        "a weak reference to every non-arena tensor the captured ops read, checked after "
        "each batch's update hook"),
    "arena_write": FaultKind(
        ERROR, "the step writes outside its own buffers",
        "an op of the step (not of the builds) mutates storage inside the arena"),
    "staging_race": FaultKind(
        ERROR, "host staging rewritten under an in-flight replay",
        "a replay held back on the GPU by a sleep kernel while the staging writer writes "
        "the next step; the replay must still compute the step it was launched for"),
    "rng_generator": FaultKind(
        ERROR, "random numbers from a generator the replay does not advance",
        "a seeded op inside the capture with a generator other than the default CUDA one"),
    "pool_reuse": FaultKind(
        ERROR, "pool memory of a live graph freed and reused by another graph",
        "an allocation that outlived its capture is freed while its graph lives and a "
        "later capture's allocation overlaps it"),
    "wrong_stream": FaultKind(
        ERROR, "work issued on a stream outside the capture",
        "an op (a collective included) launched while the current stream is not the "
        "capturing one: it runs once, now, and never on replay"),
    "eager_failure": FaultKind(
        ERROR, "the step fails eagerly", "the warm-up run before the capture raised"),
    "capture_failure": FaultKind(
        ERROR, "the capture broke",
        "the capture raised; the dispatch mode names the last op"),
}


def severity_of(kind: str) -> str:
    """``"error"`` or ``"note"`` for a kind of :data:`FAULT_KINDS` (KeyError otherwise)."""
    return FAULT_KINDS[kind].severity


@dataclass(frozen=True, slots=True)
class Finding:
    """One finding of the checker.

    kind : a key of :data:`FAULT_KINDS`; severity : "error" or "note" (from the kind);
    message : what was seen, naming the op, buffer or batch; size : the captured size in
    tokens (None for a finding about the whole check).
    """

    kind: str
    severity: str
    message: str
    size: int | None = None

    def to_dict(self) -> dict:
        """The finding as a JSON-ready dict (kind, severity, message, size)."""
        return asdict(self)


def finding(kind: str, message: str, size: int | None = None) -> Finding:
    """A :class:`Finding` whose severity follows the rule for ``kind``."""
    return Finding(kind, severity_of(kind), message, size)
