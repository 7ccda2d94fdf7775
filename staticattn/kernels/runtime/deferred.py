"""Deferred Triton kernel definitions.

Triton decides at decoration time whether a kernel is compiled or interpreted (from
``TRITON_INTERPRET``), so kernels are defined on first use, never at import: importing
staticattn neither imports Triton nor freezes that choice.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_jit", "publish"]


def lazy_jit(define: Callable[[], Any]) -> Callable[[], Any]:
    """Wrap a zero-argument function that imports Triton and returns a ``@triton.jit``
    kernel; calling the wrapper defines the kernel once and returns it thereafter."""
    return functools.cache(define)


def publish(module_globals: dict[str, Any], *helpers: Any) -> None:
    """Make ``@triton.jit`` helpers defined on first use callable from kernels.

    Triton looks a kernel's callees up among its module's globals (the interpreter even
    re-executes the kernel's source there), not in the function that defined it; a helper
    defined inside a :func:`lazy_jit` function is therefore published under its own name.
    """
    for helper in helpers:
        module_globals[helper.fn.__name__] = helper
