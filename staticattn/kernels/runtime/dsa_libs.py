"""The optional DeepSeek kernel libraries, DeepGEMM and FlashMLA, imported in one place.

Neither is on PyPI in a usable form (the ``deep-gemm 1.0.0`` and ``flash-mla 1.0.0.dev0``
packages there predate every API used here); both are built from source:

* DeepGEMM v2.6.1 (``deep_gemm``): ``get_paged_mqa_logits_metadata`` and
  ``fp8_paged_mqa_logits`` (the indexer's decode logits);
* FlashMLA at a commit that still has the sm90 sparse kernels (``9241ae3`` or earlier):
  ``flash_mla_with_kvcache`` with ``indices=`` (sparse FP8 decode), the lazy-planning
  ``get_mla_metadata()`` and ``flash_mla_sparse_fwd`` (sparse bf16 prefill; it came with the
  sparse decode, so every build with the lazy planning has it).

Everything else in staticattn works without them. Each import is attempted once per process
and its failure remembered (a failing import walks ``sys.path``, and importing
``deep_gemm`` initialises its runtime); :func:`require` raises one
:class:`~staticattn.errors.BackendUnavailableError` that says what is missing and why.

What is remembered can be forgotten: :func:`forget` (after installing a library in a running
process) and :func:`hidden` (tests that need a library absent) clear the remembered imports
and everything memoised from them with :func:`memoised_on_libs`.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any, TypeVar

import torch

from staticattn.errors import BackendUnavailableError

__all__ = [
    "DEEP_GEMM", "FLASH_MLA", "available", "forget", "hidden", "import_error",
    "memoised_on_libs", "require",
]

DEEP_GEMM = "deep_gemm"
FLASH_MLA = "flash_mla"

#: What each library must offer here; an older build that lacks one is "not available".
_NEEDED = {
    DEEP_GEMM: ("get_paged_mqa_logits_metadata", "fp8_paged_mqa_logits", "get_num_sms"),
    FLASH_MLA: ("flash_mla_with_kvcache", "get_mla_metadata", "flash_mla_sparse_fwd"),
}

_HINT = {
    DEEP_GEMM: "DeepGEMM >= 2.4 (v2.6.1 tested), built from source",
    FLASH_MLA: "FlashMLA with the sm90 sparse decode (commit 9241ae3 tested), built from source",
}


F = TypeVar("F", bound=Callable[..., Any])

#: Caches derived from what the libraries offer, cleared with the imports by :func:`forget`.
_DERIVED: list[Any] = []


def memoised_on_libs(fn: F) -> F:
    """``functools.cache`` for a function whose result depends on which libraries import;
    :func:`forget` clears it too."""
    cached = functools.cache(fn)
    _DERIVED.append(cached)
    return cached  # type: ignore[return-value]


def forget() -> None:
    """Forget every remembered import (success or failure) and whatever was memoised from
    them: the next use imports again."""
    _load.cache_clear()
    for cached in _DERIVED:
        cached.cache_clear()


@contextmanager
def hidden(*names: str) -> Iterator[None]:
    """Make the libraries ``names`` unimportable for the duration (as if not installed),
    forgetting what was remembered before and after, so neither state leaks."""
    unknown = [n for n in names if n not in _NEEDED]
    if unknown:
        raise ValueError(f"unknown optional libraries {unknown}; known: {sorted(_NEEDED)}")
    saved = {n: sys.modules.get(n, _ABSENT) for n in names}
    try:
        for n in names:
            sys.modules[n] = None  # type: ignore[assignment]  # import raises ImportError
        forget()
        yield
    finally:
        for n, module in saved.items():
            if module is _ABSENT:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = module
        forget()


_ABSENT = object()


@functools.cache
def _load(name: str) -> tuple[ModuleType | None, str | None]:
    if name not in _NEEDED:
        raise ValueError(f"unknown optional library {name!r}; known: {sorted(_NEEDED)}")
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # any import-time failure means "not usable here"
        return None, f"import {name} failed: {type(exc).__name__}: {exc}"
    missing = [attr for attr in _NEEDED[name] if not hasattr(module, attr)]
    if missing:
        return None, f"{name} is installed but lacks {', '.join(missing)} (too old)"
    if name == FLASH_MLA:
        try:
            probe = module.get_mla_metadata()[0]
        except TypeError:  # the older API takes the lengths and schedules at once
            probe = None
        if not hasattr(probe, "have_initialized"):
            return None, ("flash_mla is installed but schedules its tiles eagerly (the "
                          "pre-2026 get_mla_metadata API); the lazy FlashMLASchedMeta API is "
                          "needed")
    return module, None


def import_error(name: str) -> str | None:
    """Why ``name`` cannot be used here, or None when it can (CUDA included)."""
    if not torch.cuda.is_available():
        return f"{name} needs a CUDA device; torch.cuda.is_available() is False"
    return _load(name)[1]


def available() -> dict[str, bool]:
    """``{"deep_gemm": bool, "flash_mla": bool}``: importable, complete, and CUDA present."""
    return {name: import_error(name) is None for name in _NEEDED}


def require(name: str) -> ModuleType:
    """The module ``name``, or :class:`BackendUnavailableError` saying why not."""
    reason = import_error(name)
    if reason is not None:
        raise BackendUnavailableError(f"{_HINT[name]} is required here: {reason}")
    module, _ = _load(name)
    assert module is not None
    return module
