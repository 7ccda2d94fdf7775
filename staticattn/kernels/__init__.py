"""Device work of the builders: Triton kernels for CUDA, plain-torch versions for anywhere.

Every function here takes ``backend`` first: ``"triton"`` launches its Triton kernel,
``"torch"`` runs the plain-torch version (:func:`resolve_backend` picks it per device)."""

from staticattn.kernels.runtime.backend import resolve_backend, triton_interpreted

__all__ = ["resolve_backend", "triton_interpreted"]
