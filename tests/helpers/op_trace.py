"""Which torch ops a piece of code runs: for the tests that show a graph-safe build runs the
same ops whatever the data and reads nothing back to the host."""

from __future__ import annotations

import traceback

from torch.utils._python_dispatch import TorchDispatchMode

#: Ops that read device values back to the host (a sync, or a data-dependent shape).
HOST_READS = {
    "_local_scalar_dense", "item", "nonzero", "masked_select", "unique", "_unique2",
    "unique_consecutive", "repeat_interleave", "is_nonzero", "equal", "allclose",
}


class OpTrace(TorchDispatchMode):
    """Records the name of every torch op dispatched inside the ``with`` block."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


class NoHostReads(TorchDispatchMode):
    """Fails the ``with`` block at the first op that reads the device back to the host (what
    a CUDA graph capture refuses; on the CPU nothing else would show it), naming the op and
    the package line that ran it."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in HOST_READS:
            here = [f"{f.filename.rsplit('staticattn/', 1)[-1]}:{f.lineno}"
                    for f in traceback.extract_stack() if "/staticattn/" in f.filename]
            raise AssertionError(f"{name}, a host read, at {here[-1] if here else '?'}")
        return func(*args, **(kwargs or {}))
