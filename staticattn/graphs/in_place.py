"""The in-place front end of :class:`~staticattn.graphs.GraphManager`: an engine's decode loop
writes a step straight into the pinned staging views and launches it with one call.

``views = begin_step()`` waits until the previous replay has read the staging and hands the
views out for one step; the engine writes ``views.seq_lens[:k]``, ``views.slot_mapping[:t]``
(and ``views.query_start_loc[: k + 1]`` for a step of any composition, with DeepSeek V4.1's
bounded replay ``views.replay_start[:k]``, a vision model's ``views.image_spans[:m]``);
``launch(k)`` or ``launch(k, t)`` has the written prefixes checked
(:class:`~staticattn.validation.step_checks.StepChecks`), asks the
:class:`~staticattn.graphs.dispatch.Dispatcher` for the graph and launches it. Nothing is
converted or copied on the host.

The step contract: each ``begin_step()`` hands out one step, and ``launch()`` takes only a
step begun and not yet launched. A launch without it would relaunch whatever the views
still hold, and skip the wait for the previous replay's read of the staging; it is a
:class:`~staticattn.errors.GraphError` instead. A launch refused by a check leaves the step
begun: the engine may mend the views and launch again.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from staticattn.errors import GraphError
from staticattn.graphs.captured import GraphKind
from staticattn.graphs.dispatch import Dispatcher, StepKey
from staticattn.graphs.eager import EagerSteps
from staticattn.graphs.options import EagerBuild
from staticattn.staging import HostViews, StagedCounts, StepInputs
from staticattn.validation.step_checks import StepChecks

__all__ = ["InPlaceSteps"]

DECODE, MIXED = GraphKind.DECODE, GraphKind.MIXED


class InPlaceSteps:
    """In-place steps of one manager (see the module docstring).

    Takes the inputs, the manager's :class:`~staticattn.graphs.dispatch.Dispatcher`,
    :class:`~staticattn.graphs.eager.EagerSteps` and :class:`~staticattn.validation.
    step_checks.StepChecks`, and ``require_open`` (the manager's: raises once it is closed).
    Offers :meth:`begin_step` and :meth:`launch`. Whether a step is handed out is the
    inputs' ``handed_out``: any other writer of the staging waits for it to be free first
    (:meth:`~staticattn.staging.StepInputs.wait_staging_free`), which ends the hand-out.
    """

    def __init__(self, inputs: StepInputs, dispatcher: Dispatcher, eager: EagerSteps,
                 checks: StepChecks, require_open: Callable[[], None]) -> None:
        self.inputs, self.config = inputs, inputs.config
        self.dispatcher, self.eager, self.checks = dispatcher, eager, checks
        self._counts = inputs.counts
        self._seq_lens = inputs.host.seq_lens
        self._n = self.config.next_n
        self._graph_builds = eager.build is EagerBuild.GRAPH
        self._require_open = require_open
        self._images = inputs.images
        self._span_capacity = 0 if self._images is None else self._images.capacity

    def begin_step(self) -> HostViews:
        """Wait until the previous step has read the staging (nearly always already true),
        then hand out its views to write the next step into."""
        self._require_open()
        inputs = self.inputs
        inputs.wait_staging_free()
        if self._images is not None:
            self._images.handed_out()
        inputs.handed_out = True
        return inputs.host

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

        The step goes to the graph the dispatcher picks: a uniform decode step beyond the
        decode graphs to the token bucket that holds it (its query starts are then written
        here), a step no graph holds to the eager build.

        Returns the graph's outputs at their captured extent (the first ``t`` rows are the
        step's; valid until the next step), or, when no captured graph holds the step, the
        eager step's outputs. Raises :class:`GraphError` for a launch without a step begun,
        and a typed error before launching anything when ``validate`` is on and a bound is
        broken; a bad ``num_spans`` always.
        """
        inputs = self.inputs
        if not inputs.handed_out:
            self._not_begun()
        if num_tokens is None:
            num_reqs = operator.index(num_reqs)
            if num_spans is not None:
                self.checks.span_count(num_spans, uniform=True)
            self.checks.decode_views(num_reqs)
            dispatcher = self.dispatcher
            g = dispatcher.decode(num_reqs, self._longest_seq(num_reqs)
                                  if dispatcher.many_contexts else 0)
            if g is None:
                return self._miss(num_reqs, num_reqs * self._n, True)
            self._counts.uniform(num_reqs)
            inputs.handed_out = False
            g.launch()
            g.replays += 1
            return g.outputs
        num_reqs, num_tokens = operator.index(num_reqs), operator.index(num_tokens)
        if num_spans is not None and (type(num_spans) is not int
                                      or not 0 <= num_spans <= self._span_capacity):
            num_spans = self.checks.span_count(num_spans)
        self.checks.step_views(num_reqs, num_tokens, num_spans)
        g = self.dispatcher.bucket(MIXED, num_reqs, num_tokens)
        self._counts.step(num_reqs, num_tokens, num_spans)
        if g is None:
            return self._miss(num_reqs, num_tokens, False)
        inputs.handed_out = False
        g.launch()
        g.replays += 1
        return g.outputs

    def _longest_seq(self, num_reqs: int) -> int:
        seq = self._seq_lens[:num_reqs]
        return seq.item(seq.argmax()) if num_reqs > 0 else 0

    def _not_begun(self) -> None:
        self._require_open()
        raise GraphError("launch() takes the step written into the views begin_step() handed "
                         "out, once: call views = gm.begin_step(), write the step, then "
                         "launch it (a launch without begin_step() would relaunch stale views "
                         "and skip the wait for the previous replay's read of the staging)")

    def _miss(self, num_reqs: int, num_tokens: int, uniform: bool) -> Any:
        """A step of the in-place views that the lookup of its own kind does not hold: the
        graph the dispatcher routes it to, else the eager step under its reason."""
        self._require_open()
        host, n = self.inputs.host, self._n
        if uniform:  # a token bucket (or the eager build) reads the query starts
            host.query_start_loc[: num_reqs + 1] = np.arange(num_reqs + 1) * n
            self._counts.step(num_reqs, num_tokens, 0)  # decodes read no span
        query_lens = np.diff(host.query_start_loc[: num_reqs + 1])
        longest, longest_seq = int(query_lens.max()), self._longest_seq(num_reqs)
        all_n = int(query_lens.min()) == longest == n
        g, reason = self.dispatcher.route(StepKey(
            DECODE if all_n else MIXED, num_tokens, num_reqs, longest, longest_seq))
        self.inputs.handed_out = False
        if g is not None:
            g.launch()
            g.replays += 1
            return g.outputs
        self.dispatcher.count_eager(reason)
        if self._graph_builds:
            return self.eager.graph_builds(num_reqs, num_tokens, all_n)
        counts = StagedCounts(num_reqs, num_tokens, num_reqs, num_tokens, longest, longest_seq)
        return self.eager.reference_builds(counts)
