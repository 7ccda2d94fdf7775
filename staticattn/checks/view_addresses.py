"""Address stability of metadata: the views a build returns, compared field by field."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["moved_views", "tensors_in"]


def tensors_in(obj: Any) -> list[tuple[str, torch.Tensor]]:
    """(path, tensor) pairs of every tensor reachable in a metadata object (dicts, lists,
    tuples and dataclasses walked), e.g. ``(".indexer.decode.seq_lens", tensor)``; the
    tensors as they are (any dtype and shape, views not copies)."""
    found: list[tuple[str, torch.Tensor]] = []

    def walk(x, path):
        if isinstance(x, torch.Tensor):
            found.append((path, x))
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{path}.{k}")
        elif isinstance(x, list | tuple):
            for i, v in enumerate(x):
                walk(v, f"{path}[{i}]")
        elif hasattr(x, "__dataclass_fields__"):
            for k in x.__dataclass_fields__:
                walk(getattr(x, k), f"{path}.{k}")

    walk(obj, "")
    return found


def moved_views(first: Any, second: Any,
                held: Callable[[torch.Tensor], bool] | None = None) -> list[str]:
    """Paths whose tensor differs in address, shape or stride between two metadata objects
    (or exists in one only): a re-pointed buffer.

    Tensors of any dtype and shape are compared (dtype, shape, stride, address).
    ``held`` (e.g. the arena's membership test) limits the comparison to the tensors a
    build promises to keep in place; others -- a library's tile schedule, allocated inside the
    capture and fresh in every eager build -- are the pool checks' concern."""
    a = dict(tensors_in(first))
    b = dict(tensors_in(second))
    moved = []
    for path in sorted(set(a) | set(b)):
        ta, tb = a.get(path), b.get(path)
        if held is not None and not any(t is not None and held(t) for t in (ta, tb)):
            continue
        if ta is None or tb is None or (
                (ta.data_ptr(), ta.shape, ta.stride()) != (tb.data_ptr(), tb.shape, tb.stride())):
            moved.append(path.lstrip("."))
    return moved
