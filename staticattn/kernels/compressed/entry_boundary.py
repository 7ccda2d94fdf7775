"""Whether a step writes any compressed entry of a type: the reference's ``c128_boundary``
(``vllm-0.33-extras.md`` §4.3, §8) as a device flag.

The reference's C128 compressor skips its compress/store step when no request's scheduled
tokens cross a multiple of 128, decided by a host bool; a graph would replay whichever
branch ran at capture. Here the flag is an int32 on the device, written inside the graph
from the step's compressed slot mapping: 1 when some token writes an entry (its slot
``>= 0``, which for a type without the own-slot gate is exactly a real token with
``(p + 1) % R == 0``), else 0. A compressor kernel reads it and returns early on the
device; no host branch decides anything.

Example (``R = 128``): one request at ``L = 300`` with 3 new tokens (positions 297..299)
-> 0; with 200 new tokens (positions 100..299, 255 completes entry 1) -> 1.
"""

from __future__ import annotations

import torch

from staticattn.kernels.runtime.compiled_launch import launch
from staticattn.kernels.runtime.deferred import lazy_jit

__all__ = ["entry_written"]

_BLOCK = 1024


def entry_written(backend: str, slots: torch.Tensor, flag_out: torch.Tensor, *,
                  num_tokens: int) -> None:
    """``flag_out[0] = 1`` if any of ``slots[:num_tokens]`` is ``>= 0``, else 0.

    Parameters
    ----------
    slots : int64 device ``(>= num_tokens,)``
        A type's compressed slot mapping (-1 = no entry written, padded tokens included).
    flag_out : int32 device ``(1,)``
    num_tokens : int
        Static extent.

    Graph-safe with either backend: one program (Triton), no host read.
    """
    if backend == "triton":
        launch(_kernel(), (1,), slots, flag_out, num_tokens, BLOCK=_BLOCK)
        return
    flag_out.copy_((slots[:num_tokens] >= 0).any().view(1))


@lazy_jit()
def _kernel(triton, tl):
    @triton.jit
    def entry_written_kernel(slots, flag_out, num_tokens, BLOCK: tl.constexpr):
        seen = tl.zeros([BLOCK], dtype=tl.int32)
        for t0 in range(0, num_tokens, BLOCK):
            t = t0 + tl.arange(0, BLOCK)
            s = tl.load(slots + t, mask=t < num_tokens, other=-1)
            seen = tl.maximum(seen, (s >= 0).to(tl.int32))
        tl.store(flag_out, tl.max(seen, axis=0))

    return entry_written_kernel
