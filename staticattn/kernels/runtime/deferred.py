"""Deferred Triton kernel definitions, and the one preamble every kernel factory shares.

Triton decides at decoration time whether a kernel is compiled or interpreted (from
``TRITON_INTERPRET``), so kernels are defined on first use, never at import: importing
staticattn neither imports Triton nor freezes that choice.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_jit", "publish"]


def lazy_jit(*helpers: Callable[[], Any]) -> Callable[[Callable[..., Any]], Callable[[], Any]]:
    """Decorate a function that defines Triton code, so that it runs on first use.

    ``@lazy_jit(step_counts_jit)`` over ``def _kernel(triton, tl, live_tokens, **_)``: the
    first call of ``_kernel()`` imports Triton, calls each of ``helpers`` (functions
    decorated so, each returning a ``@triton.jit`` helper or a tuple of them), publishes
    what they return into the decorated function's module (:func:`publish`) together with
    ``triton.language`` as ``tl`` (the interpreter wants it among a jit function's module
    globals), and calls the function with ``triton``, ``triton.language`` and those helpers
    by name. Later calls return the first call's result (a kernel, or helpers).
    """

    def decorate(define: Callable[..., Any]) -> Callable[[], Any]:
        @functools.cache
        @functools.wraps(define)
        def first_use() -> Any:
            import triton
            import triton.language as tl

            made = []
            for helper in helpers:
                out = helper()
                made += out if isinstance(out, tuple) else (out,)
            define.__globals__["tl"] = tl
            publish(define.__globals__, *made)
            return define(triton, tl, **{h.fn.__name__: h for h in made})

        return first_use

    return decorate


def publish(module_globals: dict[str, Any], *helpers: Any) -> None:
    """Make ``@triton.jit`` helpers defined on first use callable from kernels.

    Triton looks a kernel's callees up among its module's globals (the interpreter even
    re-executes the kernel's source there), not in the function that defined it; a helper
    defined inside a :func:`lazy_jit` function is therefore published under its own name.
    """
    for helper in helpers:
        module_globals[helper.fn.__name__] = helper
