"""Python's garbage collector held off while a CUDA stream captures.

A collection in the middle of a capture can free what the capture must not see freed:

* a tensor whose memory the graph already baked in;
* a pinned host block (an old arena's) that an earlier step copied from on a stream of
  torch's pool. Torch's host allocator records the block's release event on each stream
  that used it; when that stream is the one capturing (the pool hands the same streams out
  again), the event becomes a node of the capture instead of being recorded, can never be
  queried, and every later pinned allocation of that size class fails with
  ``cudaErrorInvalidValue`` (``CUDAEvent::query`` in ``process_events_for_specific_size``).

So every capture of the package runs under :func:`gc_paused` or :func:`frozen_gc`.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["frozen_gc", "gc_paused"]


@contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic collection inside the block (what it leaves is collected later, outside
    the capture); cheap enough for a capture on the serving path."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextmanager
def frozen_gc() -> Iterator[None]:
    """:func:`gc_paused` after a full collection, with the survivors frozen: for the
    manager's captures, where a collection would also cost time per captured size."""
    gc.collect()
    gc.freeze()
    try:
        with gc_paused():
            yield
    finally:
        gc.unfreeze()
