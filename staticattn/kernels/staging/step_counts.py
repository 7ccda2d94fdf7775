"""The Triton helper through which kernels read a step's counts: one place for the slots of
``step_counts`` inside kernels.

``step_counts`` (int32, device, ``NUM_COUNTS`` long) holds a step's requests, tokens,
decodes and decode tokens at the slots ``COUNT_REQS``, ``COUNT_TOKENS``, ``COUNT_DECODES``
and ``COUNT_DECODE_TOKENS`` of :mod:`staticattn.kernels.staging.stage_inputs`, written by the
staging kernels inside a graph. A kernel built for a graph whose counts are decided per replay
(``DEVICE_COUNTS``) reads them there; otherwise it takes the count its launch passed
(``static``). A ``@triton.jit`` function reads no module-level int, only a ``tl.constexpr``,
so the slots reach kernels as the constexprs ``SLOT_*``, made from ``COUNT_*`` on first use.
"""

from __future__ import annotations

from staticattn.kernels.runtime.deferred import lazy_jit
from staticattn.kernels.staging.stage_inputs import (
    COUNT_DECODE_TOKENS,
    COUNT_DECODES,
    COUNT_REQS,
    COUNT_TOKENS,
)

__all__ = ["step_counts_jit"]


@lazy_jit()
def step_counts_jit(triton, tl):
    """The ``@triton.jit`` helper ``live_count(counts, SLOT, static, DEVICE_COUNTS) -> int32``
    and the slots ``SLOT_REQS``, ``SLOT_TOKENS``, ``SLOT_DECODES``, ``SLOT_DECODE_TOKENS`` to
    pass it (defined on first use; a kernel takes them by naming this function in its
    :func:`~staticattn.kernels.runtime.deferred.lazy_jit`)."""

    @triton.jit
    def live_count(counts, SLOT: tl.constexpr, static, DEVICE_COUNTS: tl.constexpr):
        """``counts[SLOT]`` where the counts are decided on the device, else ``static``."""
        n = static
        if DEVICE_COUNTS:
            n = tl.load(counts + SLOT)
        return n

    return {"live_count": live_count, "SLOT_REQS": tl.constexpr(COUNT_REQS),
            "SLOT_TOKENS": tl.constexpr(COUNT_TOKENS), "SLOT_DECODES": tl.constexpr(COUNT_DECODES),
            "SLOT_DECODE_TOKENS": tl.constexpr(COUNT_DECODE_TOKENS)}
