"""The graphs of one manager by kind and size, and the lookup from a step to the smallest
graph that holds it."""

from __future__ import annotations

import bisect

from staticattn.arena import ArenaConfig
from staticattn.errors import GraphError
from staticattn.graphs.captured import CapturedGraph, GraphKind, RunStats

__all__ = ["GraphTable"]

DECODE, MIXED = GraphKind.DECODE, GraphKind.MIXED


class GraphTable:
    """Captured graphs keyed by kind (:class:`GraphKind`) and size (tokens).

    Takes the config (capacities, ``next_n``). Owns one record per kind and size; a record
    is added once and never replaced. Offers :meth:`add`, :meth:`get`, :meth:`sizes`, the
    step lookups :meth:`pick` (a manager's decode graphs and token buckets) and
    :meth:`holding` (any kind, by a search), :meth:`clear`, :attr:`pool_bytes` and
    :meth:`describe`; and, for the replay paths, two lists indexed without a search:

    * ``decode[k]``: the smallest decode graph of at least ``k`` requests;
    * ``mixed[t]``: the smallest token bucket of at least ``t`` tokens (its request slots
      are the caller's to check).

    Both hold None where no graph fits. :meth:`add` and :meth:`clear` replace them with new
    lists, so a reader keeps the table and reads the list per step.
    """

    __slots__ = ("_graphs", "_max_reqs", "_max_tokens", "_next_n", "decode", "mixed")

    def __init__(self, config: ArenaConfig) -> None:
        self._max_reqs = config.max_num_seqs
        self._max_tokens = config.max_num_batched_tokens
        self._next_n = config.next_n
        self._graphs: dict[GraphKind, dict[int, CapturedGraph]] = {k: {} for k in GraphKind}
        self.decode: list[CapturedGraph | None] = [None] * (self._max_reqs + 1)
        self.mixed: list[CapturedGraph | None] = [None] * (self._max_tokens + 1)

    def add(self, *records: CapturedGraph) -> None:
        """Keep each record under its kind and size; the lookups include it at once."""
        for g in records:
            self._graphs[g.kind][g.size] = g
        kinds = {g.kind for g in records}
        if DECODE in kinds:
            by_reqs = {g.num_reqs: g for g in self._graphs[DECODE].values()}
            self.decode = _smallest_at_least(by_reqs, self._max_reqs)
        if MIXED in kinds:
            self.mixed = _smallest_at_least(self._graphs[MIXED], self._max_tokens)

    def clear(self) -> None:
        """Drop every graph."""
        for graphs in self._graphs.values():
            graphs.clear()
        self.decode = [None] * (self._max_reqs + 1)
        self.mixed = [None] * (self._max_tokens + 1)

    def by_size(self, kind: GraphKind) -> dict[int, CapturedGraph]:
        """The graphs of ``kind`` by size in tokens (the table's own dict: read it only)."""
        return self._graphs[kind]

    def sizes(self, kind: GraphKind) -> list[int]:
        """The captured sizes of ``kind``, ascending (tokens)."""
        return sorted(self._graphs[kind])

    def get(self, kind: GraphKind, size: int) -> CapturedGraph:
        """The graph of ``kind`` captured for ``size`` tokens; :class:`GraphError` if none."""
        graphs = self._graphs[kind]
        if size not in graphs:
            raise GraphError(f"no {kind.value} graph of {size} tokens was captured; captured: "
                             f"{sorted(graphs) or 'none'}")
        return graphs[size]

    def __len__(self) -> int:
        return sum(len(g) for g in self._graphs.values())

    def pick(self, num_reqs: int, num_tokens: int, uniform: bool,
             longest: int) -> tuple[CapturedGraph | None, str | None]:
        """``(graph, None)`` when a decode graph or token bucket holds the step, else
        ``(None, reason)``: "not-captured", "prefill" / "non-uniform" (no token bucket
        captured) or "too-large". ``uniform``: every request schedules ``next_n`` tokens;
        ``longest``: the longest query."""
        decode, mixed = self.decode, self.mixed
        if uniform and num_reqs < len(decode) and decode[num_reqs] is not None:
            return decode[num_reqs], None
        g = mixed[num_tokens] if num_tokens < len(mixed) else None
        if g is not None:
            if g.num_reqs >= num_reqs:
                return g, None
            # More requests than the bucket's slots: only zero-token requests get a step
            # there (a bucket of t tokens has min(t, max_num_seqs) slots). A larger bucket
            # with the slots holds it; never the too-small one.
            g = self.holding(MIXED, num_reqs, num_tokens)
            if g is not None:
                return g, None
        if not (self._graphs[DECODE] or self._graphs[MIXED]):
            return None, "not-captured"
        if not self._graphs[MIXED] and not uniform:
            return None, "prefill" if longest > self._next_n else "non-uniform"
        return None, "too-large"

    def holding(self, kind: GraphKind, num_reqs: int, num_tokens: int) -> CapturedGraph | None:
        """The smallest graph of ``kind`` of at least ``num_tokens`` tokens and
        ``num_reqs`` requests, or None (a search: for kinds without a lookup list)."""
        graphs = self._graphs[kind]
        sizes = sorted(graphs)
        for size in sizes[bisect.bisect_left(sizes, num_tokens):]:
            if graphs[size].num_reqs >= num_reqs:
                return graphs[size]
        return None

    @property
    def pool_bytes(self) -> int:
        """What the captures of these graphs added to their pool (bytes)."""
        return sum(g.pool_bytes for graphs in self._graphs.values() for g in graphs.values())

    def describe(self, stats: RunStats) -> str:
        """A row per decode graph and token bucket -- kind, tokens, requests, capture time,
        nodes, pool memory, how it is launched -- then the totals and ``stats``."""
        mixed, decode = self._graphs[MIXED], self._graphs[DECODE]
        lines = [f"{'kind':>6} {'tokens':>6} {'reqs':>5} {'capture ms':>11} {'kernels':>8} "
                 f"{'nodes':>6} {'pool MiB':>9}  launch"]
        records = [*sorted(mixed.values(), key=lambda g: g.size),
                   *sorted(decode.values(), key=lambda g: g.size)]
        for g in records:
            nodes = g.nodes or {}
            lines.append(
                f"{g.kind.value:>6} {g.size:>6} {g.num_reqs:>5} {g.capture_s * 1e3:>11.1f} "
                f"{nodes.get('kernel', '-'):>8} {sum(nodes.values()) if nodes else '-':>6} "
                f"{g.pool_bytes / 2**20:>9.2f}  {g.how}"
            )
        total = sum(g.pool_bytes for g in records)
        per_kind = ", ".join(
            f"{len(group)} {kind.value} in {sum(g.capture_s for g in group.values()):.2f} s"
            for kind, group in ((MIXED, mixed), (DECODE, decode)) if group)
        lines.append(f"{len(records)} graphs, pool {total / 2**20:.2f} MiB, capture "
                     f"{sum(g.capture_s for g in records):.2f} s ({per_kind or 'none'})")
        lines.append(f"replays {stats.replays} decode + {stats.mixed_replays} mixed, "
                     f"eager {dict(stats.eager)}")
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
