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

    ``@lazy_jit(step_counts_jit)`` over ``def _kernel(triton, tl, live_count, **_)``: the
    first call of ``_kernel()`` imports Triton, calls each of ``helpers`` (functions
    decorated so, each returning a ``@triton.jit`` helper, a tuple of them, or a dict of
    helpers and ``tl.constexpr`` values by name), publishes what they return into the
    decorated function's module (as :func:`publish` does) together with
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

            made = {}
            for helper in helpers:
                out = helper()
                if not isinstance(out, dict):
                    out = {h.fn.__name__: h for h in (out if isinstance(out, tuple) else (out,))}
                made.update(out)
            define.__globals__["tl"] = tl
            define.__globals__.update(made)
            return define(triton, tl, **made)

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
