"""Launching a Triton kernel at the cost of its compiled launcher.

Most of the host time of ``kernel[grid](*args)`` goes to binding the arguments, computing
their specialisation and looking the compiled kernel up; and each pinned host tensor among
the arguments costs a driver query on top (the staging kernels
read two to four of them). :func:`launch` does that once per specialisation and then calls
the compiled kernel's launcher directly with integer addresses, which it takes as they are.

The specialisation key is computed from the arguments as Triton would see them: each
tensor's dtype and 16-byte alignment, each int's value class (1, a multiple of 16, 64-bit),
the constexprs, the kernel -- a superset of what Triton keys a compilation on, so a cached
kernel is only ever launched with arguments it was compiled for. Interpreted Triton (CPU)
always takes the ordinary path.

While a recorder is installed (:func:`recording`), every launch is also handed to it with
the compiled kernel, and :func:`record_event` hands it the events the launches are ordered
with: that is how the recorded launches learn what a step's builds launch.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import torch

from staticattn.kernels.runtime.backend import triton_interpreted

__all__ = ["LaunchRecorder", "grid_size", "launch", "launch_rows", "pow2_at_least",
           "record_event", "recording"]


class LaunchRecorder(Protocol):
    """What :func:`recording` installs: told of every kernel launch and event record."""

    def kernel(self, compiled: Any, kernel: Any, grid: tuple[int, ...],
               args: tuple[Any, ...]) -> None:
        """``compiled`` (what ``kernel[grid](*args, ...)`` returned) was launched on
        ``grid`` with the runtime arguments ``args``."""

    def event(self, event: torch.cuda.Event) -> None:
        """``event`` was recorded on the current stream."""


_recorder: LaunchRecorder | None = None


@contextmanager
def recording(recorder: LaunchRecorder) -> Iterator[LaunchRecorder]:
    """Hand ``recorder`` every launch and event record made inside the block.

    The recorder is one per process, like a stream capture's effect on the thread that
    runs it: a launch by another thread meanwhile is handed to it too. Recorded launches
    count their capture's kernel nodes against what they were handed, so such a record comes out
    incomplete, never wrong."""
    global _recorder
    if _recorder is not None:
        raise RuntimeError("launches are already being recorded")
    _recorder = recorder
    try:
        yield recorder
    finally:
        _recorder = None


def record_event(event: torch.cuda.Event) -> None:
    """``event.record()`` on the current stream, told to the recorder if there is one."""
    event.record()
    if _recorder is not None:
        _recorder.event(event)

#: Specialisation key -> (compiled kernel, constexpr values in signature order, the JIT
#: function), or None where the fast path does not apply (constexprs interleaved with
#: runtime arguments).
_compiled: dict[tuple, tuple[Any, tuple[Any, ...]] | None] = {}


def _arg_key(arg: Any) -> Any:
    kind = type(arg)
    # The exact type first (the common case; bools are ints to isinstance, not to Triton).
    if kind is int or (kind is not bool and isinstance(arg, int)):
        return arg == 1, arg % 16 == 0, -(2**31) <= arg < 2**31
    if isinstance(arg, torch.Tensor):
        return arg.dtype, arg.data_ptr() % 16 == 0
    if kind is bool:
        return "b", arg
    return kind.__name__


def launch(kernel, grid: tuple[int, ...], *args: Any, **constexprs: Any) -> None:
    """``kernel[grid](*args, **constexprs)``, cheaply after the first launch of a
    specialisation. ``args`` are the kernel's runtime arguments in order (the constexprs
    follow them in its signature)."""
    if triton_interpreted():
        kernel[grid](*args, **constexprs)
        return
    # The kernel by identity: hashing a JIT function hashes its source key (a microsecond).
    # The entry holds the kernel, so the identity is never reused while it is cached.
    key = (id(kernel), tuple(constexprs.items()), *map(_arg_key, args))
    hit = _compiled.get(key, False)
    if not hit:
        compiled = kernel[grid](*args, **constexprs)
        if _recorder is not None:
            _recorder.kernel(compiled, kernel, grid, args)
        names = getattr(kernel, "arg_names", None)  # a JIT function (not a wrapper of one)
        if hit is False and names is not None:
            # The launcher takes every parameter in signature order, constexprs included.
            tail = names[len(args):]
            _compiled[key] = ((compiled, tuple(constexprs[name] for name in tail), kernel)
                              if sorted(tail) == sorted(constexprs) else None)
        return
    compiled, constexpr_values, _ = hit
    if _recorder is not None:
        _recorder.kernel(compiled, kernel, grid, args)
    # The current device without ``torch.cuda.current_device``'s initialisation checks:
    # a cached kernel means CUDA is initialised.
    stream = torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice())
    values = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args]
    g0 = grid[0]
    g1 = grid[1] if len(grid) > 1 else 1
    g2 = grid[2] if len(grid) > 2 else 1
    compiled.run(g0, g1, g2, stream, compiled.function, compiled.packed_metadata, None, None,
                  None, *values, *constexpr_values)


#: Rows per program of a row-tiled kernel (:func:`launch_rows`), and the widest column tile.
ROW_TILE = 4
MAX_COL_TILE = 1024


def launch_rows(kernel, num_rows: int, width: int, *args: Any, **constexprs: Any) -> None:
    """:func:`launch` of a row-tiled kernel over rows ``[0, num_rows)`` of ``width`` columns:
    :data:`ROW_TILE` rows a program (its ``ROWS``), the columns a tile of ``COLS`` at a time
    (the next power of two of ``width``, at most :data:`MAX_COL_TILE`)."""
    launch(kernel, (grid_size(num_rows, ROW_TILE),), *args, **constexprs, ROWS=ROW_TILE,
           COLS=min(pow2_at_least(width), MAX_COL_TILE))


def grid_size(extent: int, block: int) -> int:
    """Programs covering ``extent`` items ``block`` at a time, at least one. (Plain ints:
    ``triton.cdiv`` is a jit function, several microseconds per call from Python.)"""
    return max(-(-extent // block), 1)


def pow2_at_least(n: int, floor: int = 1) -> int:
    """The smallest power of two ``>= max(n, floor)``."""
    n = max(n, floor)
    return 1 << (n - 1).bit_length()
