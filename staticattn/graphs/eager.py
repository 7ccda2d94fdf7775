"""The eager part of :class:`~staticattn.graphs.GraphManager`: the device work of a step no
captured graph holds, once its host values are staged.

Two ways (:class:`~staticattn.graphs.options.EagerBuild`):

* the graph builds (:meth:`EagerSteps.graph_builds`): what a graph holds -- the staging
  kernels, every builder's ``build_decode`` or ``build_mixed`` -- launched at the step's own
  extents, through their recorded launches when there are some
  (:mod:`~staticattn.graphs.recorded_launches`);
* the reference builds (:meth:`EagerSteps.reference_builds`): every builder's ``build``,
  with host planning, at exact extents.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from staticattn.builders.batch import Batch
from staticattn.errors import GraphError
from staticattn.graphs.captured import GraphKind, slice_outputs
from staticattn.graphs.capturer import Capturer
from staticattn.graphs.options import EagerBuild
from staticattn.graphs.recorded_launches import RecordedLaunches
from staticattn.staging import StagedCounts, StepInputs

__all__ = ["EagerSteps"]


class EagerSteps:
    """Eager steps of one manager.

    Takes the inputs, the builders, the step, the :class:`~staticattn.graphs.capturer.
    Capturer` (whose ``builds`` are what a graph holds at given extents), the eager build
    choice (None: ``EagerBuild.GRAPH`` when every builder has both graph builds, else
    ``REFERENCE``; ``GRAPH`` without them is a :class:`GraphError`) and how many extents'
    recorded launches to keep. Owns ``build`` (the resolved choice) and
    ``recorded_launches`` (None where they do not apply: a capacity of 0, the reference
    builds, torch kernels, no CUDA or no cuda-bindings). Offers :meth:`graph_builds` and
    :meth:`reference_builds`; neither times nor counts (the manager does).
    """

    def __init__(self, inputs: StepInputs, builders: Sequence, step: Callable,
                 capturer: Capturer, choice: EagerBuild | None, capacity: int) -> None:
        graph_builds = all(hasattr(b, "build_decode") and hasattr(b, "build_mixed")
                           for b in builders)
        if choice is EagerBuild.GRAPH and not graph_builds:
            raise GraphError("eager_build=EagerBuild.GRAPH needs build_decode and build_mixed "
                             "on every builder")
        if choice is None:
            choice = EagerBuild.GRAPH if graph_builds else EagerBuild.REFERENCE
        self.build = choice
        self.inputs, self.builders, self.step = inputs, list(builders), step
        self._builds = capturer.builds
        self.recorded_launches = (
            RecordedLaunches(capturer.builds, capacity)
            if (capacity and choice is EagerBuild.GRAPH and inputs.backend == "triton"
                and inputs.device.type == "cuda" and RecordedLaunches.available())
            else None)

    def graph_builds(self, num_reqs: int, num_tokens: int, uniform: bool, *,
                     recorded: bool = True) -> Any:
        """The device half of an eager step whose host values are already staged (counts
        included): what a graph holds -- staging kernels, every builder's ``build_decode``
        (``uniform``: ``num_reqs`` requests of ``next_n`` tokens) or ``build_mixed``, the
        step -- launched eagerly at the step's own extents, through the recorded launches
        unless ``recorded`` is off. Outputs for the real tokens."""
        kind = GraphKind.DECODE if uniform else GraphKind.MIXED
        if recorded and self.recorded_launches is not None:
            batch, metadata = self.recorded_launches.run(kind, num_reqs, num_tokens)
        else:
            batch, metadata = self._builds(kind, num_reqs, num_tokens)
        return slice_outputs(self.step(batch, metadata), num_tokens)

    def reference_builds(self, counts: StagedCounts,
                         phase_done: Callable[[str], None] | None = None) -> Any:
        """The device half of an eager step whose host values are already staged: the
        reference builds (``build``), launched one kernel at a time. Outputs for the real
        tokens. ``phase_done(name)``, when given, is called as each phase ends ("staging
        kernels", "build <builder>", "step"): how the bench times them."""
        self.inputs.copy_to_device(counts.num_reqs_padded, counts.num_tokens_padded)
        batch = Batch.from_staged(self.inputs, counts)
        done = phase_done or (lambda phase: None)
        done("staging kernels")
        metadata = {}
        for b in self.builders:
            metadata[b.name] = b.build(batch)
            done(f"build {b.name}")
        outputs = self.step(batch, metadata)
        done("step")
        return slice_outputs(outputs, counts.num_tokens)
