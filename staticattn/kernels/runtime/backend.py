"""Which implementation of a kernel runs: Triton (CUDA, or CPU under the interpreter) or
plain torch (anywhere).

Both implementations of every kernel are graph-safe: no device->host read, no Python branch
on tensor values, outputs written into the views they are given. The torch versions may
allocate temporaries: harmless eagerly, and captured they come from the graph's pool, but
the sanity checker reports them as fresh tensors; captured steps use Triton by default.
"""

from __future__ import annotations

import functools
import os

import torch

from staticattn.errors import BackendUnavailableError

__all__ = ["resolve_backend", "triton_interpreted"]


@functools.cache
def triton_interpreted() -> bool:
    """True when Triton kernels run on the CPU interpreter (``TRITON_INTERPRET=1``). Read
    once: Triton itself decides when it is first imported, and it is asked on every launch."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def resolve_backend(requested: str, device: torch.device) -> str:
    """Turn ``"auto" | "torch" | "triton"`` into the backend that runs on ``device``.

    "auto" is Triton on CUDA and torch elsewhere. Triton on a CPU tensor needs the
    interpreter, which must be switched on before Triton is first imported.
    """
    if requested == "auto":
        return "triton" if device.type == "cuda" else "torch"
    if requested == "torch":
        return "torch"
    if requested == "triton":
        if device.type != "cuda" and not triton_interpreted():
            raise BackendUnavailableError(
                "kernel_backend='triton' on a CPU device needs TRITON_INTERPRET=1, set before "
                "triton is imported; use kernel_backend='torch' (or 'auto') instead"
            )
        try:
            import triton  # noqa: F401
        except ImportError as exc:
            raise BackendUnavailableError(
                f"kernel_backend='triton' but triton is missing: {exc}"
            ) from None
        return "triton"
    raise BackendUnavailableError(
        f"unknown kernel backend {requested!r}; expected 'auto', 'torch' or 'triton'"
    )
