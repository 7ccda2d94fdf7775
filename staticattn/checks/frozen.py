"""What a capture froze: the first call where the captured body and an eager run part ways.

A replay that computes something else than the graph's body run eagerly on the same padded
batch (``replay_mismatch``) has one cause: something that depends on the step was fixed at
capture. The watch records every call of the captured body (:class:`Call`: the op, the
phase, every argument -- a tensor as where it lives, its shape and strides, anything else as
its value -- and the line of Python that issued it); the checker records the eager body on
the first step that differed, and :func:`frozen_cause` names the first call that differs:

* ``frozen_branch``: another op, or another line: a Python branch on the step's data,
  chosen at capture (a short-context shortcut taken with the warm-up's short sequences);
* ``frozen_address``: the same op reads a tensor at another address: a buffer the engine
  hands anew each step (the graph reads the one it captured);
* ``frozen_stride``: the same op gives a view of other strides: a row stride taken from
  the step;
* ``frozen_value``: the same op with another argument: a value the host computed from the
  step's data (a plan, a count, a bound), baked into the graph.

Example: a step that plans its KV splits on the host, ``plan[r].fill_(ceil(L_r / 64))``, is
captured with the warm-up's lengths (1) and run eagerly on lengths ``[300, ...]``:
``'fill_' (step) at my_step.py:12: argument 'value' is 5 for this step, 1 at capture``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

__all__ = ["Call", "Seen", "call_of", "frozen_cause"]

#: Frames skipped when naming the line that issued a call: torch's and the checker's own.
_SKIPPED = (str(Path(torch.__file__).parent), str(Path(__file__).parent))


@dataclass(frozen=True, slots=True)
class Seen:
    """A tensor argument as a call saw it: ``where`` it lives ("arena", "fresh": allocated
    earlier in the same run, "external", "host"), ``which`` one (an address; a fresh
    tensor's allocation index in the run and offset; a 0-dim host tensor's value), its
    dtype, shape and strides."""

    where: str
    which: Any
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.dtype}{list(self.shape)} ({self.where})"


@dataclass(frozen=True, slots=True)
class Call:
    """One op of a traced run: its name, phase ("build" or "step"), arguments by schema
    name, the strides of its tensor outputs, and ``source`` (``file:line`` of the innermost
    frame outside torch and the checker)."""

    op: str
    phase: str
    args: tuple[tuple[str, Any], ...]
    out_strides: tuple[tuple[int, ...], ...]
    source: str

    def __str__(self) -> str:
        return f"'{self.op}' ({self.phase}) at {self.source}"


def call_of(name: str, phase: str, arguments: list[tuple[str, Any]], out,
            seen: Callable[[torch.Tensor], Seen]) -> Call:
    """The :class:`Call` of op ``name`` given ``arguments`` (``(schema name, value)`` pairs)
    that returned ``out``; ``seen`` describes a tensor argument (the watch knows the arena
    and what the run allocated). Tensors of any dtype and shape."""

    def value(x):
        if isinstance(x, torch.Tensor):
            return seen(x)
        if isinstance(x, list | tuple):
            return tuple(value(v) for v in x)
        return x

    outs = tuple(t.stride() if t.layout == torch.strided else () for t in tree_flatten(out)[0]
                 if isinstance(t, torch.Tensor))
    return Call(name, phase, tuple((n, value(v)) for n, v in arguments), outs, _source())


def _source() -> str:
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(_SKIPPED):
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}"


def frozen_cause(captured: list[Call], eager: list[Call]) -> tuple[str, str] | None:
    """``(kind, message)`` for the first call where ``eager`` (the body run on a later step)
    departs from ``captured`` (the captured body), or None when the two runs match. Calls on
    host tensors alone are left out: the graph holds none of them (a host read of the step's
    data differs from step to step by design; what capture froze of it shows in the device
    calls that follow)."""
    captured, eager = ([c for c in calls if not _host_only(c)] for calls in (captured, eager))
    for a, b in zip(captured, eager):
        if a == b:
            continue
        if (a.op, a.phase, a.source) != (b.op, b.phase, b.source):
            return ("frozen_branch", f"this step ran {b} where the capture ran {a}: a Python "
                    "branch on the step's data (a shortcut) was taken at capture; decide it on "
                    "the device, or from static facts")
        if a.out_strides != b.out_strides:
            return _stride(b, a.out_strides, b.out_strides)
        for (name, x), (_, y) in zip(a.args, b.args):
            if x != y:
                return _argument(b, name, x, y)
    if len(captured) == len(eager):
        return None
    longer, what = (eager, "this step") if len(eager) > len(captured) else (captured,
                                                                           "the capture")
    return ("frozen_branch", f"{what} ran {longer[min(len(captured), len(eager))]} after "
            f"the {min(len(captured), len(eager))} calls both ran: a Python branch on the "
            "step's data was taken at capture; decide it on the device, or from static facts")


def _host_only(call: Call) -> bool:
    """Whether every tensor ``call`` took lives on the host (at least one)."""
    seen = [x for _, v in call.args for x in (v if isinstance(v, tuple) else (v,))
            if isinstance(x, Seen)]
    return bool(seen) and all(x.where == "host" for x in seen)


def _argument(call: Call, name: str, captured, own) -> tuple[str, str]:
    """The kind and message of argument ``name`` of ``call``: ``captured`` at capture,
    ``own`` for this step."""
    if isinstance(captured, Seen) and isinstance(own, Seen):
        moved = (captured.where, captured.which) != (own.where, own.which)
        if moved and "host" not in (captured.where, own.where):
            return ("frozen_address", f"{call} reads {own} at another address than at capture "
                    f"(argument '{name}'): a buffer handed anew each step; the graph reads the "
                    "one it captured: update one buffer in place")
        if captured.stride != own.stride and not moved:
            return _stride(call, captured.stride, own.stride)
        captured, own = (captured.which, own.which) if moved else (captured.shape, own.shape)
    if "stride" in name:
        return _stride(call, captured, own)
    return ("frozen_value", f"{call}: argument '{name}' is {own} for this step, {captured} at "
            "capture: a value the host computed from the step's data (a plan, a count, a "
            "bound) is baked into the graph; compute it on the device, or from static facts")


def _stride(call: Call, captured, own) -> tuple[str, str]:
    """The kind and message of strides that differ: an argument's, or the strides of the
    call's outputs (one tuple per output)."""
    captured, own = (", ".join(map(str, x)) if x and isinstance(x[0], tuple) else str(x)
                     for x in (captured, own))
    return ("frozen_stride", f"{call} gives strides {own} for this step, {captured} at "
            "capture: a row stride taken from the step's data is baked into the graph; lay "
            "the buffer out with a static stride (its capacity)")
