"""Which graph replays a step, or why the step runs eagerly: the one owner of that decision.

Every front end -- ``run`` (host arrays), the in-place ``launch``, the steps whose lengths a
device kernel decides -- describes its step as a :class:`StepKey` (kind, tokens, requests)
and asks the :class:`Dispatcher`; none of them looks a graph up or names a reason itself.
The dispatcher keeps every captured graph of one manager, keyed by kind and size, with one
lookup per kind:

* ``DECODE``: the smallest decode graph of at least ``k`` requests, in the smallest context
  bucket that holds the step's longest sequence (one bucket, ``max_model_len``, unless the
  manager has several: :func:`~staticattn.graphs.sizes.default_context_buckets`);
* ``MIXED`` and ``DEVICE_LENGTHS``: the smallest token bucket of at least ``t`` tokens with
  at least ``k`` request slots.

A uniform decode step that no decode graph holds goes to the token bucket that holds it
(``DECODE``'s fallback kind); a step no graph holds gets an
:class:`~staticattn.graphs.captured.EagerReason`. Replays are counted on the graph replayed
(``CapturedGraph.replays``), eager steps per reason here; :attr:`Dispatcher.stats` sums them
per kind, per reason and per context bucket.

What differs per kind is one :class:`KindRule` (its lookup, its fallback kind) in
:data:`RULES`; a new kind of step is a new key with its rule
(:meth:`Dispatcher.register`) and the :class:`~staticattn.graphs.capturer.GraphSpec` of its
graphs (what they build), nothing else here.
"""

from __future__ import annotations

import bisect
import enum
from collections import Counter
from dataclasses import dataclass
from typing import Any, NamedTuple

from staticattn.arena import ArenaConfig
from staticattn.errors import GraphError
from staticattn.graphs.captured import CapturedGraph, EagerReason, GraphKind

__all__ = ["RULES", "DispatchStats", "Dispatcher", "KindRule", "Lookup", "StepKey"]

DECODE, MIXED, DEVICE_LENGTHS = GraphKind.DECODE, GraphKind.MIXED, GraphKind.DEVICE_LENGTHS


class Lookup(enum.Enum):
    """How a kind's graphs are found for a step."""

    #: The smallest graph of at least ``k`` requests, in the smallest context bucket that
    #: holds the step's longest sequence (uniform decode graphs: their tokens follow).
    BY_REQUESTS = "requests"
    #: The smallest graph of at least ``t`` tokens with at least ``k`` request slots.
    BY_TOKENS = "tokens"


@dataclass(frozen=True, slots=True)
class KindRule:
    """What the dispatcher does with a kind of step: its ``lookup``, and the kind whose
    graphs serve a step its own graphs do not hold (``fallback``, or None)."""

    lookup: Lookup
    fallback: Any = None


#: The rule of every kind the package captures graphs for.
RULES = {
    DECODE: KindRule(Lookup.BY_REQUESTS, fallback=MIXED),
    MIXED: KindRule(Lookup.BY_TOKENS),
    DEVICE_LENGTHS: KindRule(Lookup.BY_TOKENS),
}


class StepKey(NamedTuple):
    """A step as the dispatcher sees it: its kind, tokens and requests; for a step with a
    prefill (``MIXED``) its longest query, which tells a prefill from unequal decodes when no
    bucket holds it; for a decode step under several context buckets, its longest
    sequence."""

    kind: GraphKind
    num_tokens: int
    num_reqs: int
    longest_query: int = 0
    longest_seq: int = 0


@dataclass(frozen=True, slots=True)
class DispatchStats:
    """A manager's step counts: replays per kind, eager steps per reason, decode replays
    per context bucket (tokens)."""

    replays: Counter
    eager: Counter
    context_replays: Counter

    @property
    def replays_total(self) -> int:
        return sum(self.replays.values())

    @property
    def eager_total(self) -> int:
        return sum(self.eager.values())


class Dispatcher:
    """The captured graphs of one manager and the decision for each step (see the module).

    Takes the config (capacities, ``next_n``) and the context buckets (tokens, ascending,
    the last ``max_model_len``). A graph is added once and never replaced. Offers
    :meth:`register`, :meth:`add`, :meth:`clear`, :meth:`graphs`, :meth:`sizes`,
    :meth:`get`, the lookups :meth:`decode` (``DECODE``'s, every decode step's) and
    :meth:`bucket` (any ``BY_TOKENS`` kind's), the decision :meth:`route`,
    :meth:`count_eager`, :attr:`stats`, :attr:`pool_bytes` and :meth:`describe`.
    """

    __slots__ = ("_by_reqs", "_by_tokens", "_config", "_contexts", "_eager", "_graphs",
                 "_next_n", "_rules", "decode", "many_contexts")

    def __init__(self, config: ArenaConfig, contexts: list[int]) -> None:
        self._config, self._next_n = config, config.next_n
        self._contexts = list(contexts)
        #: Several context buckets: a decode lookup needs the step's longest sequence.
        self.many_contexts = len(self._contexts) > 1
        self._rules: dict[Any, KindRule] = {}
        self._graphs: dict[Any, dict[tuple[int, int], CapturedGraph]] = {}
        self._by_reqs: dict[Any, list[list[CapturedGraph | None]]] = {}
        self._by_tokens: dict[Any, list[CapturedGraph | None]] = {}
        self._eager: Counter = Counter()
        for kind, rule in RULES.items():
            self.register(kind, rule)
        # The decode lookup every decode step makes, picked once (a bound method).
        self.decode = self._decode_in_context if self.many_contexts else self._decode_one

    def register(self, kind: Any, rule: KindRule) -> None:
        """Serve a new kind of step (a hashable with a ``value`` name, an enum member) by
        ``rule``; :class:`GraphError` for a kind already served."""
        if kind in self._rules:
            raise GraphError(f"the {kind.value} kind is already served")
        self._rules[kind] = rule
        self._graphs[kind] = {}
        self._reset(kind)

    # ------------------------------------------------------------------ the graphs
    def add(self, *graphs: CapturedGraph) -> None:
        """Keep each graph under its kind, context and size; the lookups hold it at once."""
        for g in graphs:
            self._graphs[g.kind][(g.context_len, g.size)] = g
        self._rebuild({g.kind for g in graphs})

    def clear(self) -> None:
        """Drop every graph (the eager counts stay)."""
        for kind, graphs in self._graphs.items():
            graphs.clear()
            self._reset(kind)

    def _reset(self, kind: Any) -> None:
        """The lookup list(s) of ``kind``, empty."""
        cfg = self._config
        if self._rules[kind].lookup is Lookup.BY_REQUESTS:
            self._by_reqs[kind] = [[None] * (cfg.max_num_seqs + 1) for _ in self._contexts]
        else:
            self._by_tokens[kind] = [None] * (cfg.max_num_batched_tokens + 1)

    def graphs(self, kind: Any, context_len: int | None = None) -> dict[int, CapturedGraph]:
        """The graphs of ``kind`` by size in tokens (a new dict); of a ``BY_REQUESTS`` kind,
        those of one context bucket (default: the widest, ``max_model_len``)."""
        context = self._contexts[-1] if context_len is None else context_len
        per_context = self._rules[kind].lookup is Lookup.BY_REQUESTS
        return {size: g for (c, size), g in self._graphs[kind].items()
                if not per_context or c == context}

    def all_graphs(self) -> list[CapturedGraph]:
        """Every graph, of every kind and context."""
        return [g for graphs in self._graphs.values() for g in graphs.values()]

    def sizes(self, kind: Any) -> list[int]:
        """The captured sizes of ``kind``, ascending (tokens; decode graphs of the widest
        context bucket)."""
        return sorted(self.graphs(kind))

    def get(self, kind: Any, size: int, context_len: int | None = None) -> CapturedGraph:
        """The graph of ``kind`` captured for ``size`` tokens (a decode graph: of the context
        bucket ``context_len``, default the widest); :class:`GraphError` if none."""
        graphs = self.graphs(kind, context_len)
        if size not in graphs:
            raise GraphError(f"no {kind.value} graph of {size} tokens was captured; captured: "
                             f"{sorted(graphs) or 'none'}")
        return graphs[size]

    def __len__(self) -> int:
        return sum(len(g) for g in self._graphs.values())

    def _rebuild(self, kinds: set) -> None:
        """The lookup lists of ``kinds``, new lists (a reader keeps the dispatcher, never a
        list): of a ``BY_REQUESTS`` kind ``[c][k]``, its smallest graph of context bucket
        ``c`` with at least ``k`` requests (a narrower bucket without one borrows the
        widest's); of a ``BY_TOKENS`` kind ``[t]``, its smallest of at least ``t`` tokens."""
        cfg = self._config
        for kind in kinds:
            graphs = self._graphs[kind]
            if self._rules[kind].lookup is Lookup.BY_TOKENS:
                self._by_tokens[kind] = _smallest_at_least(
                    {size: g for (_, size), g in graphs.items()}, cfg.max_num_batched_tokens)
                continue
            lists = [_smallest_at_least({g.num_reqs: g for (c, _), g in graphs.items()
                                         if c == context}, cfg.max_num_seqs)
                     for context in self._contexts]
            widest = lists[-1]
            self._by_reqs[kind] = [[g if g is not None else w for g, w in zip(own, widest)]
                                   for own in lists[:-1]] + [widest]

    # ------------------------------------------------------------------ lookups
    def _decode_one(self, num_reqs: int, longest_seq: int = 0) -> CapturedGraph | None:
        table = self._by_reqs[DECODE][0]
        return table[num_reqs] if 0 <= num_reqs < len(table) else None

    def _decode_in_context(self, num_reqs: int, longest_seq: int = 0) -> CapturedGraph | None:
        return self.by_requests(DECODE, num_reqs, longest_seq)

    def by_requests(self, kind: Any, num_reqs: int, longest_seq: int = 0) -> CapturedGraph | None:
        """The smallest graph of ``BY_REQUESTS`` kind ``kind`` of at least ``num_reqs``
        requests, in the smallest context bucket holding ``longest_seq``, or None."""
        i = min(bisect.bisect_left(self._contexts, longest_seq), len(self._contexts) - 1)
        table = self._by_reqs[kind][i]
        return table[num_reqs] if 0 <= num_reqs < len(table) else None

    def bucket(self, kind: Any, num_reqs: int, num_tokens: int) -> CapturedGraph | None:
        """The smallest graph of ``BY_TOKENS`` kind ``kind`` (a token bucket: ``MIXED``,
        ``DEVICE_LENGTHS``) of at least ``num_tokens`` tokens and ``num_reqs`` request
        slots, or None."""
        table = self._by_tokens[kind]
        g = table[num_tokens] if 0 <= num_tokens < len(table) else None
        if g is None or g.num_reqs >= num_reqs:
            return g
        # More requests than the bucket's slots: only zero-token requests get a step there
        # (a bucket of t tokens has min(t, max_num_seqs) slots). A larger bucket with the
        # slots holds it; never the too-small one.
        sizes = sorted(size for _, size in self._graphs[kind])
        for size in sizes[bisect.bisect_left(sizes, num_tokens):]:
            if table[size].num_reqs >= num_reqs:
                return table[size]
        return None

    # ------------------------------------------------------------------ the decision
    def route(self, key: StepKey) -> tuple[CapturedGraph | None, EagerReason | None]:
        """``(graph, None)`` when a graph holds the step ``key``, else ``(None, reason)``:
        the lookup of its kind, then of its kind's fallback (a ``DECODE`` key, every request
        ``next_n`` tokens, takes a decode graph, else the token bucket that holds it)."""
        kind, tried = key.kind, []
        while kind is not None:
            rule = self._rules[kind]
            g = (self.by_requests(kind, key.num_reqs, key.longest_seq)
                 if rule.lookup is Lookup.BY_REQUESTS
                 else self.bucket(kind, key.num_reqs, key.num_tokens))
            if g is not None:
                return g, None
            tried.append(kind)
            kind = rule.fallback
        return None, self._reason(key, tried)

    def _reason(self, key: StepKey, tried: list) -> EagerReason:
        """Why no graph of the kinds ``tried`` holds ``key``: none of them captured, no token
        bucket for a step that needs one (a prefill, unequal decodes) while decode graphs
        exist, or every graph too small."""
        graphs = self._graphs
        if key.kind is MIXED and not graphs[MIXED] and graphs[DECODE]:
            return (EagerReason.PREFILL if key.longest_query > self._next_n
                    else EagerReason.NON_UNIFORM)
        if not any(graphs[kind] for kind in tried):
            return EagerReason.NOT_CAPTURED
        return EagerReason.TOO_LARGE

    def count_eager(self, reason: EagerReason) -> None:
        """Count one eager step under ``reason``."""
        self._eager[reason] += 1

    # ------------------------------------------------------------------ reports
    @property
    def stats(self) -> DispatchStats:
        """The counts so far (a snapshot)."""
        replays, contexts = Counter(), Counter()
        for g in self.all_graphs():
            replays[g.kind] += g.replays
            if self._rules[g.kind].lookup is Lookup.BY_REQUESTS:
                contexts[g.context_len] += g.replays
        return DispatchStats(+replays, Counter(self._eager), +contexts)

    @property
    def pool_bytes(self) -> int:
        """What the captures of these graphs added to their pool (bytes)."""
        return sum(g.pool_bytes for g in self.all_graphs())

    def describe(self) -> str:
        """A row per graph -- kind, context, tokens, requests, capture time, nodes, pool
        memory, how it is launched, replays -- then the totals and the eager counts."""
        lines = [f"{'kind':>14} {'context':>8} {'tokens':>6} {'reqs':>5} {'capture ms':>11} "
                 f"{'kernels':>8} {'nodes':>6} {'pool MiB':>9} {'replays':>8}  launch"]
        records = sorted(self.all_graphs(), key=lambda g: (g.kind.value, -g.context_len,
                                                             g.size))
        for g in records:
            nodes = g.nodes or {}
            per_context = self._rules[g.kind].lookup is Lookup.BY_REQUESTS
            context = g.context_len if per_context else "-"
            lines.append(
                f"{g.kind.value:>14} {context:>8} {g.size:>6} {g.num_reqs:>5} "
                f"{g.capture_s * 1e3:>11.1f} {nodes.get('kernel', '-'):>8} "
                f"{sum(nodes.values()) if nodes else '-':>6} {g.pool_bytes / 2**20:>9.2f} "
                f"{g.replays:>8}  {g.how}")
        per_kind = ", ".join(
            f"{n} {kind.value} in {sum(g.capture_s for g in group):.2f} s"
            for kind in self._rules
            if (n := len(group := [g for g in records if g.kind is kind])))
        lines.append(f"{len(records)} graphs, pool {self.pool_bytes / 2**20:.2f} MiB, capture "
                     f"{sum(g.capture_s for g in records):.2f} s ({per_kind or 'none'})")
        stats = self.stats
        lines.append("replays " + (", ".join(f"{n} {k.value}" for k, n in stats.replays.items())
                                   or "none") + "; eager "
                     + (", ".join(f"{n} {r.value}" for r, n in stats.eager.items()) or "none"))
        return "\n".join(lines)


def _smallest_at_least(by_key: dict[int, CapturedGraph], top: int) -> list:
    """``table[i]``: the graph of the smallest key ``>= i`` (None past the largest)."""
    table: list[CapturedGraph | None] = [None] * (top + 1)
    lo = 0
    for key in sorted(by_key):
        hi = min(key, top) + 1
        if hi > lo:
            table[lo:hi] = [by_key[key]] * (hi - lo)
            lo = hi
    return table
