"""Deferred Triton kernel definitions.

Triton decides at decoration time whether a kernel is compiled or interpreted (from
``TRITON_INTERPRET``), so kernels are defined on first use, never at import: importing
staticattn neither imports Triton nor freezes that choice.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_jit"]


def lazy_jit(define: Callable[[], Any]) -> Callable[[], Any]:
    """Wrap a zero-argument function that imports Triton and returns a ``@triton.jit``
    kernel; calling the wrapper defines the kernel once and returns it thereafter."""
    return functools.cache(define)
