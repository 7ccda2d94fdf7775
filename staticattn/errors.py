"""Typed errors of staticattn.

Every error is raised *before* anything is written: after catching one, the arena, its
views and every captured graph are exactly as they were and remain usable.

Each message says what was wrong and what the limit is, e.g.
``CapacityError: num_reqs=300 exceeds max_num_seqs=256``.
"""

from __future__ import annotations

__all__ = [
    "StaticAttnError",
    "ConfigError",
    "CapacityError",
    "InvalidBatchError",
    "ArenaError",
    "GraphError",
    "BackendUnavailableError",
    "RankMismatchError",
    "RankFailureError",
    "RankTimeoutError",
    "StepSpecError",
]


class StaticAttnError(Exception):
    """Base class of every error staticattn raises on purpose."""


class ConfigError(StaticAttnError, ValueError):
    """An :class:`~staticattn.arena.ArenaConfig` field or combination is invalid."""


class CapacityError(StaticAttnError, ValueError):
    """A batch or request exceeds a capacity fixed by the config (the arena cannot grow)."""


class InvalidBatchError(StaticAttnError, ValueError):
    """A batch is malformed: wrong dtype/device/shape, inconsistent or negative lengths, ..."""


class ArenaError(StaticAttnError, RuntimeError):
    """The arena was misused: declaring after allocation, duplicate or unknown names, ..."""


class GraphError(StaticAttnError, RuntimeError):
    """The graph manager was misused, or a captured step broke the graph-safety rule."""


class BackendUnavailableError(StaticAttnError, RuntimeError):
    """A requested kernel backend or optional library cannot run here."""


class RankMismatchError(StaticAttnError, RuntimeError):
    """The ranks of a decode-context-parallel group disagree -- handed different steps,
    configs or ranks. Raised on every rank, before anything is staged or launched."""


class RankFailureError(StaticAttnError, RuntimeError):
    """A rank of a decode-context-parallel group failed: it died (its connections closed),
    or a step failed on a rank mid-way. Raised on every rank still running, within the
    group's step deadline; the group is broken afterwards (``distributed.world.abandon``)."""


class RankTimeoutError(RankFailureError):
    """A rank of a decode-context-parallel group missed the step deadline: it did not reach
    the step check, or its share of a step's collectives, in time. Raised on the ranks that
    waited, and on the late rank itself when it arrives, before it launches anything."""


class StepSpecError(StaticAttnError, ValueError):
    """A step named on the command line (``--step module:function``) cannot be used: the
    module does not import, the name is missing or not a function, or calling it with the
    config failed. The message names the spec and the cause."""
