"""Device work of the builders: Triton kernels for CUDA, plain-torch versions for anywhere."""

from staticattn.kernels.runtime.backend import resolve_backend, triton_interpreted

__all__ = ["resolve_backend", "triton_interpreted"]
