"""What a :class:`~staticattn.graphs.GraphManager` is built with: its options in one frozen
dataclass, and the two choices they name as enums, :class:`EagerBuild` and
:class:`StagingGuard`.

One vocabulary of eager builds serves both places that choose one:
``GraphOptions(eager_build=...)`` (what a step no captured graph holds runs) and
``GraphManager.run(..., eager=...)`` (run this step eagerly, even if a graph holds it).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from staticattn.errors import GraphError

__all__ = ["EagerBuild", "GraphOptions", "StagingGuard"]


class EagerBuild(enum.Enum):
    """What runs a step eagerly.

    ``GRAPH``: the builds a graph holds (the staging kernels, every builder's
    ``build_decode`` or ``build_mixed``, the step), launched eagerly at the step's own
    extents -- a few kernels, no host planning, and the metadata a replay would give; from
    the second step at the same extents through their recorded launches
    (:mod:`~staticattn.graphs.recorded_launches`). ``REFERENCE``: every builder's ``build``
    (host planning, exact extents), launched one kernel at a time.
    """

    GRAPH = "graph"
    REFERENCE = "reference"


class StagingGuard(enum.Enum):
    """Where a graph records the event the host waits for before rewriting the staging.

    ``STAGING``: right after the staging kernels, so the next step may be staged while this
    one still runs. ``STEP``: at the graph's end, where the event costs the driver less per
    launch and wait (``docs/results/launch_costs_h200.txt``), for loops that never stage a
    step before the last one finished.
    """

    STAGING = "staging"
    STEP = "step"


@dataclass(frozen=True, slots=True)
class GraphOptions:
    """The options of a :class:`~staticattn.graphs.GraphManager` (and of every manager of a
    :class:`~staticattn.graphs.ContextGraphs`), checked at construction.

    Parameters
    ----------
    validate : bool
        Check every step before anything is written or launched (default True). With False
        the caller promises what :func:`~staticattn.validation.host_arrays.
        validate_host_step` checks (``run``) or what :class:`~staticattn.builders.
        validation.views.ViewChecks` checks (``launch``); a step that breaks the promise may
        read or write out of bounds. The manager's ``validate`` starts from it and can be
        switched later (benchmarks time both on the same graphs).
    progress : bool
        Show a progress bar while capturing.
    time_gpu : bool
        Record CUDA events around each ``run``'s device work (``RunResult.gpu_us()``); the
        manager's ``time_gpu`` starts from it and can be switched later.
    num_kv_blocks : int, optional
        Blocks of the KV pool the slot mapping and the block tables address (>= 1); the
        manager checks every slot (``< num_kv_blocks x`` the block size of the slots' group)
        and the block ids it can see (``< num_kv_blocks``) against it. Required while
        ``validate`` is on (the manager refuses to be built without it): nothing else bounds
        a slot past the pool.
    raw_launch : bool
        Launch graphs through ``cudaGraphLaunch`` when cuda-bindings is there (default).
    eager_build : EagerBuild, optional
        What a step no captured graph holds runs. None (default): ``EagerBuild.GRAPH`` when
        every builder has both graph builds, else ``EagerBuild.REFERENCE``.
    recorded_launches : int
        With the ``EagerBuild.GRAPH`` eager builds on CUDA (Triton kernels, cuda-bindings),
        keep the recorded launches of up to this many extents
        (:mod:`~staticattn.graphs.recorded_launches`); 0 turns them off. Default 256.
    staging_guard : StagingGuard
        Where a graph records the staging event (default ``StagingGuard.STAGING``).
    branch_builds : bool
        Issue each builder's graph build on a stream of its own, forked after the staging
        kernels and joined before the step, so a graph holds one branch per builder and the
        GPU runs them side by side (:mod:`~staticattn.graphs.branches`; default, on CUDA).
        False: one stream, the builds in order.

    Examples
    --------
    >>> GraphOptions(num_kv_blocks=4096, staging_guard=StagingGuard.STEP).staging_guard.value
    'step'
    """

    validate: bool = True
    progress: bool = True
    time_gpu: bool = False
    num_kv_blocks: int | None = None
    raw_launch: bool = True
    eager_build: EagerBuild | None = None
    recorded_launches: int = 256
    staging_guard: StagingGuard = StagingGuard.STAGING
    branch_builds: bool = True

    def __post_init__(self) -> None:
        for name in ("validate", "progress", "time_gpu", "raw_launch", "branch_builds"):
            if not isinstance(getattr(self, name), bool):
                raise GraphError(f"{name} must be a bool; got {getattr(self, name)!r}")
        blocks = self.num_kv_blocks
        if blocks is not None and (type(blocks) is not int or blocks < 1):
            raise GraphError(f"num_kv_blocks must be None or an int >= 1; got {blocks!r}")
        if self.eager_build is not None and not isinstance(self.eager_build, EagerBuild):
            raise GraphError(f"eager_build must be None, EagerBuild.GRAPH or "
                             f"EagerBuild.REFERENCE; got {self.eager_build!r}")
        if type(self.recorded_launches) is not int or self.recorded_launches < 0:
            raise GraphError(f"recorded_launches must be an int >= 0; got "
                             f"{self.recorded_launches!r}")
        if not isinstance(self.staging_guard, StagingGuard):
            raise GraphError(f"staging_guard must be StagingGuard.STAGING or StagingGuard.STEP;"
                             f" got {self.staging_guard!r}")
