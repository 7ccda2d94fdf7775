"""The builder contract the graph manager relies on (DESIGN.md, "The builder contract").

Every builder, whatever it builds, offers:

* ``name`` -- a short unique key (``"indexer"``, ``"swa"``); metadata is handed to the step
  under it;
* ``buffers(config)`` -- the buffer declarations it needs for that config;
* ``bind(arena)`` -- takes its views and records the arena as ``arena`` (through
  :func:`claim_arena`); after this it never allocates. A builder serves one arena for life:
  binding it to another is an :class:`~staticattn.errors.ArenaError`;
* ``build(batch)`` -- metadata for any batch (mixed, prefill, decode), eager; may read the
  host-side lengths the batch carries, never the device;
* ``build_decode(batch)`` -- the graph-safe decode build for a *static* uniform decode batch
  (:meth:`Batch.for_decode_capture`): reads only arena views and static ints, launches only
  kernels, and returns metadata whose tensors are the same views on every call;
* ``build_mixed(batch)`` -- the graph-safe build for a step of any composition within a
  token bucket (:meth:`Batch.for_mixed_capture`): the same, with the real counts and the
  decode/prefill split read on the device (``batch.step_counts``); every view covers the
  bucket's capacity and holds defined values past the real step. A builder without it is
  used only in decode graphs and eagerly.

Every build returns the same metadata type, so the user's step never needs to know which
ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from staticattn.arena import Arena, ArenaConfig, BufferDecl
from staticattn.builders.batch import Batch
from staticattn.errors import ArenaError
from staticattn.staging import StepInputs, input_buffers

__all__ = ["MetadataBuilder", "bound_config", "check_bound", "claim_arena", "make_arena"]


@runtime_checkable
class MetadataBuilder(Protocol):
    """What the graph manager needs of a builder (the module docstring gives the contract);
    ``name`` keys its metadata in the step's ``metadata`` dict."""

    name: str
    #: The arena it is bound to (None before :meth:`bind`).
    arena: Arena | None

    def buffers(self, config: ArenaConfig) -> list[BufferDecl]:
        """The buffer declarations this builder needs for ``config`` (names, shapes, dtypes,
        fills), collected by :func:`make_arena` before the one allocation."""
        ...

    def bind(self, arena: Arena) -> None:
        """Take the views of an allocated ``arena`` and record it (:func:`claim_arena`); the
        builder never allocates after."""
        ...

    def build(self, batch: Batch) -> Any:
        """Metadata for any batch, eagerly (may read the batch's host-side lengths)."""
        ...

    def build_decode(self, batch: Batch) -> Any:
        """Graph-safe metadata for a static uniform decode batch: the same views on every
        call, kernels only, nothing read back."""
        ...

    # ``build_mixed(batch)`` is optional (see the module docstring), so not a member here.


def claim_arena(builder: MetadataBuilder, arena: Arena) -> None:
    """Record ``arena`` as ``builder.arena``: the first thing a builder's ``bind`` does.

    Binding again to the same arena is allowed; binding a builder bound to another arena
    raises :class:`ArenaError` naming both, before anything changes: the builder would hand
    out the second arena's views while graphs captured with the first still read those.
    Make one builder per arena instead.
    """
    bound = getattr(builder, "arena", None)
    if bound is not None and bound is not arena:
        raise ArenaError(f"builder {builder.name!r} is bound to {bound!r}; it cannot be bound "
                         f"to {arena!r} as well (make a new builder for each arena)")
    builder.arena = arena


def bound_config(builder: MetadataBuilder) -> ArenaConfig:
    """The config of the arena ``builder`` is bound to; :class:`ArenaError` while it is not
    bound (its first build before :func:`make_arena`)."""
    arena = getattr(builder, "arena", None)
    if arena is None:
        raise ArenaError(f"{type(builder).__name__} is not bound to an arena: bind it with "
                         "make_arena(config, builders)")
    return arena.config


def check_bound(arena: Arena, builders: Sequence[MetadataBuilder]) -> None:
    """Raise :class:`ArenaError` unless every builder is bound to ``arena``."""
    for b in builders:
        bound = getattr(b, "arena", None)
        if bound is not arena:
            where = "no arena" if bound is None else repr(bound)
            raise ArenaError(f"builder {getattr(b, 'name', b)!r} is bound to {where}, not to "
                             f"{arena!r}: bind the builders with make_arena(config, builders) "
                             "and use the arena it returns")


def make_arena(
    config: ArenaConfig, builders: Sequence[MetadataBuilder] = ()
) -> tuple[Arena, StepInputs]:
    """Declare the inputs and every builder's buffers, allocate once, bind the builders
    (each to this arena for life: a builder already bound is an :class:`ArenaError`).

    Returns
    -------
    arena : Arena
        Allocated and frozen.
    inputs : StepInputs
        The arena's input views and staging.
    """
    names = [b.name for b in builders]
    if len(set(names)) != len(names):
        raise ArenaError(f"builder names must be unique, got {names}")
    bound = {b.name: b.arena for b in builders if getattr(b, "arena", None) is not None}
    if bound:  # refused before allocating a second arena for nothing
        name, other = next(iter(bound.items()))
        raise ArenaError(f"builder {name!r} is already bound to {other!r}; a builder serves "
                         "one arena for life (make a new builder for each arena)")
    arena = Arena(config)
    arena.declare(input_buffers(config))
    for b in builders:
        arena.declare(b.buffers(config))
    arena.allocate()
    for b in builders:
        b.bind(arena)
        claim_arena(b, arena)  # recorded for a builder whose bind does not record it
    return arena, StepInputs(arena)
