"""The sync guard the checker captures under.

:func:`sync_guard` sets PyTorch's sync-debug mode to "error" for the duration, so an op that
would wait on the device (``.item()``, ``.tolist()``, ``nonzero``...) raises instead of
silently breaking the capture; :class:`~staticattn.checks.watch.CaptureWatch` names the op
that raised.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

__all__ = ["sync_guard"]


@contextmanager
def sync_guard():
    """Make synchronising CUDA ops raise while inside (restores the previous mode)."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)
