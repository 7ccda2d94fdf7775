"""The in-place part of :class:`~staticattn.graphs.GraphManager`: an engine's decode loop
writes a step straight into the pinned staging views and launches it with one call.

``views = begin_step()`` waits until the previous replay has read the staging; the engine
writes ``views.seq_lens[:k]``, ``views.slot_mapping[:t]`` (and ``views.query_start_loc[:
k + 1]`` for a step of any composition, with DeepSeek V4.1's bounded replay
``views.replay_start[:k]`` too); ``launch(k)`` or ``launch(k, t)`` checks the
written prefixes in a few vectorized passes (:class:`~staticattn.validation.in_place_views.
ViewChecks`) and launches the graph that holds the step. Nothing is converted or copied on
the host.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from staticattn.errors import CapacityError, InvalidBatchError
from staticattn.graphs.captured import RunStats
from staticattn.graphs.eager import EagerSteps
from staticattn.graphs.options import EagerBuild
from staticattn.graphs.table import GraphTable
from staticattn.staging import (
    COUNT_REQS,
    COUNT_SPANS,
    COUNT_TOKENS,
    HostViews,
    StagedCounts,
    StepInputs,
)
from staticattn.validation.in_place_views import ViewChecks

__all__ = ["InPlaceSteps"]


class InPlaceSteps:
    """In-place steps of one manager (see the module docstring).

    Takes the inputs, the manager's :class:`~staticattn.graphs.table.GraphTable`,
    :class:`~staticattn.graphs.captured.RunStats` and
    :class:`~staticattn.graphs.eager.EagerSteps`, the view checks (``checks``: a
    :class:`~staticattn.validation.in_place_views.ViewChecks` over the inputs' host views),
    whether to check, and ``require_open`` (the manager's: raises once it is closed).
    Offers :meth:`begin_step` and :meth:`launch`; ``validate`` may be switched on a live
    manager (through ``GraphManager.validate``).
    """

    def __init__(self, inputs: StepInputs, table: GraphTable, stats: RunStats,
                 eager: EagerSteps, checks: ViewChecks, validate: bool,
                 require_open: Callable[[], None]) -> None:
        self.inputs, self.config = inputs, inputs.config
        self.table, self.stats, self.eager = table, stats, eager
        self.validate = validate
        self.checks = checks
        self._counts = inputs.host.counts
        self._n = self.config.next_n
        self._graph_builds = eager.build is EagerBuild.GRAPH
        self._require_open = require_open
        self._images = inputs.images
        self._span_capacity = 0 if self._images is None else self._images.host.shape[0]

    def begin_step(self) -> HostViews:
        """Wait until the previous step has read the staging (nearly always already true),
        then hand out its views to write the next step into."""
        self.inputs.wait_staging_free()
        if self._images is not None:
            self._images.handed_out()
        return self.inputs.host

    def launch(self, num_reqs: int, num_tokens: int | None = None,
               num_spans: int | None = None) -> Any:
        """Launch the step written into :meth:`begin_step`'s views.

        ``launch(k)``: a uniform decode step of ``k`` requests (``next_n`` tokens each;
        ``seq_lens[:k]`` and ``slot_mapping[: k * next_n]`` written). ``launch(k, t)``: a step
        of any composition (``query_start_loc[: k + 1]`` written too, ending at ``t``; with
        bounded replay ``replay_start[:k]`` too: each prefill request's first replayed
        position, 0 for the decodes and where nothing replays -- the graph stages it for the
        prefill requests; ``launch(k)`` does not read it).

        A vision model's image spans (``views.image_spans``, rows ``(request, first,
        last)``): ``launch(k, t, num_spans=m)`` reads the first ``m`` rows, whatever the
        engine left past them (the cheap form: only ``m`` rows are checked, and the staging
        kernel stages every later row as unused). Without ``num_spans`` the step's spans are
        the rows whose request is not -1, anywhere in the block (the engine keeps unused rows
        at -1; :meth:`begin_step` hands out a block free of rows an earlier ``run`` wrote).

        The step goes to the graph ``GraphManager.run`` would pick: a uniform decode step
        beyond the decode graphs to the token bucket that holds it (its query starts are then
        written here).

        Returns the graph's outputs at their captured extent (the first ``t`` rows are the
        step's; valid until the next step), or, when no captured graph holds the step, the
        eager step's outputs. Raises a typed error before launching anything when
        ``validate`` is on and a bound is broken; a bad ``num_spans`` always.
        """
        if num_tokens is None:
            num_reqs = operator.index(num_reqs)
            if num_spans is not None and self._span_count(num_spans):
                raise InvalidBatchError(f"num_spans={num_spans!r}: a uniform decode step "
                                        f"(launch(k)) carries no image spans")
            if self.validate:
                self.checks.decode(num_reqs)
            table = self.table.decode
            g = table[num_reqs] if num_reqs < len(table) else None
            if g is None:
                return self._launch_miss(num_reqs, num_reqs * self._n, True)
            self._counts[COUNT_REQS] = num_reqs
            g.launch()
            self.stats.replays += 1
            return g.outputs
        num_reqs, num_tokens = operator.index(num_reqs), operator.index(num_tokens)
        if num_spans is not None and (type(num_spans) is not int
                                      or not 0 <= num_spans <= self._span_capacity):
            num_spans = self._span_count(num_spans)
        if self.validate:
            self.checks.step(num_reqs, num_tokens, num_spans)
        table = self.table.mixed
        g = table[num_tokens] if num_tokens < len(table) else None
        counts = self._counts
        counts[COUNT_REQS], counts[COUNT_TOKENS] = num_reqs, num_tokens
        if self._span_capacity:  # the rows the staging reads; a scan reads them all
            counts[COUNT_SPANS] = self._span_capacity if num_spans is None else num_spans
        if g is None or g.num_reqs < num_reqs:
            return self._launch_miss(num_reqs, num_tokens, False)
        g.launch()
        self.stats.mixed_replays += 1
        return g.outputs

    def _span_count(self, num_spans) -> int:
        """``num_spans`` as an int in ``[0, max_image_spans]``, else its typed error."""
        if isinstance(num_spans, bool):
            raise InvalidBatchError(f"num_spans must be an int, got {num_spans!r}")
        try:
            count = operator.index(num_spans)
        except TypeError:
            raise InvalidBatchError(f"num_spans must be an int, got {num_spans!r}") from None
        if count < 0:
            raise InvalidBatchError(f"num_spans={count} must be >= 0")
        if count > self._span_capacity:
            if self._images is None:
                raise InvalidBatchError(f"num_spans={count}, but the config has "
                                        f"max_image_tokens=0 (a text model): no spans")
            raise CapacityError(f"num_spans={count} exceeds the capacity "
                                f"max_image_spans={self._span_capacity}")
        return count

    def _launch_miss(self, num_reqs: int, num_tokens: int, uniform: bool) -> Any:
        """A step of the in-place views that the fast path's table entry does not hold:
        the graph the table picks, else the eager step (the eager part's ``build``) under
        its reason."""
        self._require_open()
        host, n = self.inputs.host, self._n
        if uniform:
            g, reason = self.table.pick(num_reqs, num_tokens, True, n)
            host.query_start_loc[: num_reqs + 1] = np.arange(num_reqs + 1) * n
            host.counts[COUNT_REQS], host.counts[COUNT_TOKENS] = num_reqs, num_tokens
            host.counts[COUNT_SPANS] = 0  # decodes read no span: stage none
        query_lens = np.diff(host.query_start_loc[: num_reqs + 1])
        longest = int(query_lens.max())
        all_n = int(query_lens.min()) == longest == n
        if not uniform:
            g, reason = self.table.pick(num_reqs, num_tokens, all_n, longest)
        if g is None:
            self.stats.eager[reason] += 1
            if self._graph_builds:
                return self.eager.graph_builds(num_reqs, num_tokens, all_n)
            counts = StagedCounts(num_reqs, num_tokens, num_reqs, num_tokens, longest,
                                  int(host.seq_lens[:num_reqs].max()))
            return self.eager.reference_builds(counts)
        g.launch()
        self.stats.count_replay(g.kind)
        return g.outputs
