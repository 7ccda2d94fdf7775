"""A compiled Triton kernel's launch frozen into one driver call.

:func:`freeze` turns a launch -- compiled kernel, grid, runtime arguments -- into a
:class:`FrozenLaunch`: the ``CUfunction``, the grid and block, the dynamic shared memory
and the parameters packed once into a buffer laid out as the driver reports the function's
parameters (``cuFuncGetParamInfo``). Launching it again is one ``cuLaunchKernel`` through
cuda-bindings, cheaper than Triton's compiled launcher with the arguments already bound, and
much cheaper than :func:`~staticattn.kernels.runtime.compiled_launch.launch`, which also binds them
and keys
their specialisation (``docs/results/launch_costs_h200.txt``). Recorded launches
(:mod:`staticattn.graphs.recorded_launches`) freeze the kernels a step's graph builds launch,
which read and write arena views at fixed addresses and take ints that depend only on the
step's extents.

A launch is frozen only when the parameters provably line up: every runtime argument's
Triton type has a fixed-size packing, the sizes match the driver's report one for one,
and the only parameters left are Triton's scratch pointers, which the kernel does not use
(no global or profile scratch). Cooperative, PDL and cluster launches are not frozen.

The parameters are asked of the driver once per function, up to the count Triton's own
launcher passes and never past it.
Otherwise :func:`freeze` returns None and the caller keeps the ordinary launch.
"""

from __future__ import annotations

import ctypes
import functools
import struct
from typing import Any

import torch

__all__ = ["FrozenLaunch", "driver_or_none", "freeze"]

# Triton argument types -> struct codes (little-endian, no padding: offsets come from the
# driver). bf16 has no struct code: a kernel taking one is not frozen.
_CODES = {
    "i1": "b", "i8": "b", "i16": "h", "i32": "i", "i64": "q",
    "u1": "B", "u8": "B", "u16": "H", "u32": "I", "u64": "Q",
    "fp16": "e", "fp32": "f", "fp64": "d",
}


@functools.cache
def driver_or_none():
    """The cuda-bindings driver module, or None when cuda-bindings is not installed."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return None
    return driver


#: CUfunction -> its parameter layout (a function's layout never changes).
_layouts: dict[int, list[tuple[int, int]] | None] = {}


def _param_layout(function: int, count: int) -> list[tuple[int, int]] | None:
    """``[(offset, size)]`` of the ``count`` parameters of ``function``, or None if the
    driver cannot say (``cuFuncGetParamInfo`` needs CUDA 12.4) or the function has fewer.
    Asked once per function, and never past ``count``: asking past the last parameter is
    an API error that sanitizers report."""
    if function not in _layouts:
        _layouts[function] = _ask_layout(function, count)
    layout = _layouts[function]
    return layout if layout is not None and len(layout) == count else None


def _ask_layout(function: int, count: int) -> list[tuple[int, int]] | None:
    driver = driver_or_none()
    if driver is None or not hasattr(driver, "cuFuncGetParamInfo"):
        return None
    layout = []
    for index in range(count):
        err, offset, size = driver.cuFuncGetParamInfo(function, index)
        if err != driver.CUresult.CUDA_SUCCESS:
            return None
        layout.append((int(offset), int(size)))
    return layout


class FrozenLaunch:
    """One kernel launch with every parameter fixed: ``launch(stream)`` issues it again.

    Holds the packed parameter buffer and the pointer array into it for as long as it
    lives (the driver copies the parameters at launch)."""

    __slots__ = ("name", "function", "grid", "block", "shared", "_buffer", "_params",
                 "_params_ptr", "_launch", "_success")

    def __init__(self, name: str, function: int, grid: tuple[int, int, int], block: int,
                 shared: int, buffer: ctypes.Array, params: ctypes.Array) -> None:
        driver = driver_or_none()
        self.name = name
        self.function = function
        self.grid = grid
        self.block = block
        self.shared = shared
        self._buffer = buffer
        self._params = params
        self._params_ptr = ctypes.addressof(params)
        self._launch = driver.cuLaunchKernel
        self._success = driver.CUresult.CUDA_SUCCESS

    def launch(self, stream: int) -> None:
        """Issue the kernel on the raw stream handle ``stream``."""
        g = self.grid
        err, = self._launch(self.function, g[0], g[1], g[2], self.block, 1, 1, self.shared,
                            stream, self._params_ptr, 0)
        if err != self._success:
            raise RuntimeError(f"cuLaunchKernel({self.name}) failed: {err}")

    def __repr__(self) -> str:
        return f"FrozenLaunch({self.name}, grid={self.grid}, block={self.block})"


def _plain_launch(metadata: Any) -> bool:
    """True when the compiled kernel launches as a plain grid of one-CTA blocks with no
    scratch memory: what a ``cuLaunchKernel`` reproduces exactly."""
    cluster = getattr(metadata, "cluster_dims", None)
    return (getattr(metadata, "num_ctas", 1) == 1
            and not getattr(metadata, "launch_pdl", False)
            and not getattr(metadata, "launch_cooperative_grid", False)
            and not getattr(metadata, "global_scratch_size", 0)
            and not getattr(metadata, "profile_scratch_size", 0)
            and (cluster is None or tuple(cluster) in ((), (1, 1, 1))))


def freeze(compiled: Any, kernel: Any, grid: tuple[int, ...],
           args: tuple[Any, ...]) -> FrozenLaunch | None:
    """Freeze the launch of ``compiled`` (what ``kernel[grid](*args, ...)`` returned) with
    the runtime arguments ``args`` (tensors or numbers, in signature order); None where the
    parameters cannot be shown to line up (see the module docstring)."""
    if driver_or_none() is None or not _plain_launch(compiled.metadata):
        return None
    signature = compiled.src.signature
    names = getattr(kernel, "arg_names", None)
    if names is None or any(not isinstance(key, str) for key in signature):
        return None
    packed: list[tuple[str, Any]] = []
    for name, arg in zip(names, args):
        kind = signature.get(name)
        if kind == "constexpr":  # a declared constexpr, or an int Triton specialised (== 1)
            continue
        code = "Q" if isinstance(kind, str) and kind.startswith("*") else _CODES.get(kind)
        if code is None:
            return None
        packed.append((code, arg.data_ptr() if isinstance(arg, torch.Tensor) else arg))
    runtime = sum(1 for kind in signature.values() if kind != "constexpr")
    if runtime != len(packed):
        return None
    # Triton appends a scratch pointer per kind of scratch its version has (global, and
    # profile since 3.5), each reported in the metadata: what its own launcher passes.
    metadata = compiled.metadata
    scratch = sum(hasattr(metadata, f"{kind}_scratch_size") for kind in ("global", "profile"))
    layout = _param_layout(compiled.function, len(packed) + scratch)
    if layout is None or any(size != 8 for _, size in layout[len(packed):]):
        return None
    if any(struct.calcsize(code) != size for (_, size), (code, _) in zip(layout, packed)):
        return None
    buffer = ctypes.create_string_buffer(max((o + size for o, size in layout), default=1))
    try:
        for (offset, _), (code, value) in zip(layout, packed):
            struct.pack_into("<" + code, buffer, offset, value)
    except (struct.error, TypeError):
        return None
    base = ctypes.addressof(buffer)
    params = (ctypes.c_void_p * len(layout))(*[base + offset for offset, _ in layout])
    g = tuple(grid) + (1,) * (3 - len(grid))
    return FrozenLaunch(getattr(kernel, "__name__", "kernel"), compiled.function, g,
                        32 * compiled.metadata.num_warps, compiled.metadata.shared, buffer,
                        params)
