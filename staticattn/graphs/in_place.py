"""The in-place step API of :class:`~staticattn.graphs.GraphManager`: an engine's decode
loop writes a step straight into the pinned staging views and launches it with one call.

``views = begin_step()`` waits until the previous replay has read the staging; the engine
writes ``views.seq_lens[:k]``, ``views.slot_mapping[:t]`` (and ``views.query_start_loc[:
k + 1]`` for a step of any composition); ``launch(k)`` or ``launch(k, t)`` checks the
written prefixes in a few vectorized passes (:class:`~staticattn.builders.validation.views.
ViewChecks`) and launches the graph that holds the step. Nothing is converted or copied on
the host.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from staticattn.builders.validation.values import check_seq_lens
from staticattn.staging import COUNT_REQS, COUNT_TOKENS, HostViews, StagedCounts

__all__ = ["InPlaceSteps"]


class InPlaceSteps:
    """The in-place half of the graph manager (see the module docstring). It reads the
    manager's ``inputs``, ``config``, ``validate``, ``stats``, its graph table and view
    checks, and falls back to its graph lookup and eager step."""

    @property
    def host(self) -> HostViews:
        """The pinned staging as numpy views; write them after :meth:`begin_step`."""
        return self.inputs.host

    def begin_step(self) -> HostViews:
        """Wait until the previous step has read the staging (nearly always already true),
        then hand out its views to write the next step into."""
        self.inputs.wait_staging_free()
        return self.inputs.host

    def launch(self, num_reqs: int, num_tokens: int | None = None) -> Any:
        """Launch the step written into :meth:`begin_step`'s views.

        ``launch(k)``: a uniform decode step of ``k`` requests (``next_n`` tokens each;
        ``seq_lens[:k]`` and ``slot_mapping[: k * next_n]`` written). ``launch(k, t)``: a step
        of any composition (``query_start_loc[: k + 1]`` written too, ending at ``t``).

        The step goes to the graph :meth:`run` would pick: a uniform decode step beyond the
        decode graphs to the token bucket that holds it (its query starts are then written
        here, and with ``validate`` on it is checked as a step of any composition: every
        sequence at least ``next_n`` long).

        Returns the graph's outputs at their captured extent (the first ``t`` rows are the
        step's; valid until the next step), or, when no captured graph holds the step, the
        eager step's outputs. Raises a typed error before launching anything when
        ``validate`` is on and a bound is broken.
        """
        if num_tokens is None:
            num_reqs = operator.index(num_reqs)
            if self.validate:
                self._checks.decode(num_reqs)
            table = self._table.decode
            g = table[num_reqs] if num_reqs < len(table) else None
            if g is None:
                return self._launch_miss(num_reqs, num_reqs * self._n, True)
            self._host_counts[COUNT_REQS] = num_reqs
            g.launch()
            self.stats.replays += 1
            return g.outputs
        num_reqs, num_tokens = operator.index(num_reqs), operator.index(num_tokens)
        if self.validate:
            self._checks.step(num_reqs, num_tokens)
        table = self._table.mixed
        g = table[num_tokens] if num_tokens < len(table) else None
        counts = self._host_counts
        counts[COUNT_REQS], counts[COUNT_TOKENS] = num_reqs, num_tokens
        if g is None or g.num_reqs < num_reqs:
            return self._launch_miss(num_reqs, num_tokens, False)
        g.launch()
        self.stats.mixed_replays += 1
        return g.outputs

    def _launch_miss(self, num_reqs: int, num_tokens: int, uniform: bool) -> Any:
        """A step of the in-place views that the fast path's table entry does not hold:
        the graph :meth:`_graph_for_step` picks, else the eager step (``eager_build``) under
        its reason."""
        self._check_open()
        host, n = self.inputs.host, self._n
        if uniform:
            g, reason = self._graph_for_step(num_reqs, num_tokens, True, n)
            seq = host.seq_lens[:num_reqs]
            if g is not None and self.validate and seq.min() < n:  # a bucket needs q <= L
                check_seq_lens(np.full(num_reqs, n), seq.astype(np.int64), self.config)
            host.query_start_loc[: num_reqs + 1] = np.arange(num_reqs + 1) * n
            host.counts[COUNT_REQS], host.counts[COUNT_TOKENS] = num_reqs, num_tokens
        query_lens = np.diff(host.query_start_loc[: num_reqs + 1])
        longest = int(query_lens.max())
        all_n = int(query_lens.min()) == longest == n
        if not uniform:
            g, reason = self._graph_for_step(num_reqs, num_tokens, all_n, longest)
        if g is None:
            self.stats.eager[reason] += 1
            if self.eager_build == "graph":
                return self.launch_graph_build(num_reqs, num_tokens, all_n)
            counts = StagedCounts(num_reqs, num_tokens, num_reqs, num_tokens, longest,
                                  int(host.seq_lens[:num_reqs].max()))
            return self.launch_eager(counts)
        g.launch()
        self.stats.count_replay(g.kind)
        return g.outputs
