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
    configs or ranks -- or one of them did not answer the consistency check in time. Raised
    on every rank that took part, before anything is staged or launched."""


class StepSpecError(StaticAttnError, ValueError):
    """A step named on the command line (``--step module:function``) cannot be used: the
    module does not import, the name is missing or not a function, or calling it with the
    config failed. The message names the spec and the cause."""
