"""Catch graph-safety violations by name while a step is captured.

* :class:`FreshTensorWatch` -- a dispatch mode that records every aten op run under it and
  flags each op whose output owns storage none of its inputs had: a tensor created on the
  captured path (``torch.empty``, ``a + b`` without ``out=``, ``.clone()``...). Views,
  in-place and ``out=`` ops are not flagged. Triton launches do not pass through aten and
  never allocate.
* :func:`sync_guard` -- PyTorch's sync-debug mode set to "error" for the duration, so an op
  that would wait on the device (``.item()``, ``.tolist()``, ``nonzero``...) raises instead
  of silently breaking the capture; the watch names the op that raised.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["FreshTensorWatch", "sync_guard"]


def _storages(args) -> set[int]:
    flat, _ = tree_flatten(args)
    return {
        t.untyped_storage().data_ptr()
        for t in flat
        if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() > 0
    }


@dataclass
class FreshTensorWatch(TorchDispatchMode):
    """Records ops and the fresh tensors they created (``op name -> count``)."""

    ops: list[str] = field(default_factory=list)
    fresh: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func.overloadpacket.__name__)
        self.ops.append(name)
        known = _storages((args, kwargs))
        out = func(*args, **kwargs)
        flat, _ = tree_flatten(out)
        for t in flat:
            if not isinstance(t, torch.Tensor) or t.device.type != "cuda":
                continue
            ptr = t.untyped_storage().data_ptr()
            if t.untyped_storage().nbytes() > 0 and ptr not in known:
                self.fresh[name] = self.fresh.get(name, 0) + 1
        return out

    @property
    def last_op(self) -> str | None:
        return self.ops[-1] if self.ops else None


@contextmanager
def sync_guard():
    """Make synchronising CUDA ops raise while inside (restores the previous mode)."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)
