"""The eager half of :class:`~staticattn.graphs.GraphManager`: the device work of a step no
captured graph holds, once its host values are staged.

Two ways, as the manager's ``eager_build`` says:

* the graph builds (:meth:`EagerSteps.launch_graph_build`): what a graph holds -- the
  staging kernels, every builder's ``build_decode`` or ``build_mixed`` -- launched at the
  step's own extents, through a launch plan when there is one
  (:mod:`~staticattn.graphs.launch_plans`);
* the reference builds (:meth:`EagerSteps.launch_eager`): every builder's ``build``, with
  host planning, at exact extents.
"""

from __future__ import annotations

from typing import Any

from staticattn.builders.batch import Batch
from staticattn.graphs.launch_plans import LaunchPlans
from staticattn.graphs.records import DECODE, MIXED, RunResult, slice_outputs
from staticattn.staging import StagedCounts

__all__ = ["EagerSteps"]


class EagerSteps:
    """Eager steps for the graph manager. It reads the manager's ``inputs``, ``builders``,
    ``step``, ``stats``, ``eager_build``, ``arena`` and its ``builds``, and times through
    its ``_record_start`` / ``_record_end``."""

    plans: LaunchPlans | None

    def _make_plans(self, capacity: int) -> LaunchPlans | None:
        """Launch plans for the graph builds, where they apply: ``capacity`` > 0, the
        "graph" eager builds, Triton kernels on CUDA, cuda-bindings installed."""
        if (capacity and self.eager_build == "graph" and self.inputs.backend == "triton"
                and self.arena.device.type == "cuda" and LaunchPlans.available()):
            return LaunchPlans(self.builds, capacity)
        return None

    def _eager_graph_build(self, num_reqs: int, num_tokens: int, uniform: bool,
                           reason: str) -> RunResult:
        """Run a staged step through the graph builds, eagerly, counted under ``reason``."""
        events = self._record_start()
        outputs = self.launch_graph_build(num_reqs, num_tokens, uniform)
        self._record_end(events)
        self.stats.eager[reason] += 1
        return RunResult(outputs, "eager", None, reason, num_tokens, events)

    def run_eager(self, q, s, slots) -> Any:
        """Stage, build every builder eagerly, run the step; outputs for the real tokens."""
        return self.launch_eager(self.inputs.stage(q, s, slots))

    def launch_graph_build(self, num_reqs: int, num_tokens: int, uniform: bool) -> Any:
        """The device half of an eager step whose host values are already staged (counts
        included): what a graph holds -- staging kernels, every builder's ``build_decode``
        (``uniform``: ``num_reqs`` requests of ``next_n`` tokens) or ``build_mixed``, the
        step -- launched eagerly at the step's own extents. Outputs for the real tokens."""
        kind = DECODE if uniform else MIXED
        if self.plans is not None:
            batch, metadata = self.plans.run(kind, num_reqs, num_tokens)
        else:
            batch, metadata = self.builds(kind, num_reqs, num_tokens)
        return slice_outputs(self.step(batch, metadata), num_tokens)

    def launch_eager(self, counts: StagedCounts) -> Any:
        """The device half of an eager step whose host values are already staged: the
        reference builds (``build``), launched one kernel at a time."""
        self.inputs.copy_to_device(counts.num_reqs_padded, counts.num_tokens_padded)
        batch = Batch.from_staged(self.inputs, counts)
        metadata = {b.name: b.build(batch) for b in self.builders}
        return slice_outputs(self.step(batch, metadata), counts.num_tokens)
