"""Decode graphs keyed by context as well as by batch size, so that a step's cost follows
the contexts it serves rather than ``max_model_len``.

Why (:func:`~staticattn.graphs.sizes.default_context_buckets` says it): a graph bakes in
the widths its consumer sizes from the batch's ``max_seq_len``. :class:`ContextGraphs` is a
:class:`~staticattn.graphs.manager.GraphManager` whose decode graphs are captured once per
context bucket (default :func:`~staticattn.graphs.sizes.default_context_buckets`), all in
one memory pool; its dispatcher sends a uniform decode step to the smallest bucket that
holds its longest sequence (the host has the lengths: a bisection over a dozen bounds),
any other step to the token buckets, captured once. The arena is the one allocation, sized
for the largest bucket.
"""

from __future__ import annotations

from collections.abc import Sequence

from staticattn.graphs.manager import GraphManager
from staticattn.graphs.options import GraphOptions
from staticattn.graphs.sizes import default_context_buckets

__all__ = ["ContextGraphs"]


class ContextGraphs(GraphManager):
    """A graph manager with context buckets: the same calls as a :class:`GraphManager`.

    Parameters
    ----------
    arena, inputs, builders, step
        As for :class:`GraphManager`.
    contexts : sequence of int, optional
        Context buckets in tokens (default :func:`~staticattn.graphs.sizes.
        default_context_buckets`); the last is ``max_model_len``.
    options : GraphOptions, optional
        As for :class:`GraphManager`.

    ``stats.context_replays`` counts the decode replays of each bucket.
    """

    def __init__(self, arena, inputs, builders, step, *, contexts: Sequence[int] | None = None,
                 options: GraphOptions | None = None) -> None:
        super().__init__(arena, inputs, builders, step, options,
                         contexts=default_context_buckets(arena.config) if contexts is None
                         else contexts)
