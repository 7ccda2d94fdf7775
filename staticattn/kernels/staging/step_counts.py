"""The Triton helpers through which kernels read a step's counts: one place for the slots of
``step_counts`` inside kernels.

``step_counts`` (int32, device, ``NUM_COUNTS`` long) holds a step's requests, tokens,
decodes and decode tokens at the slots ``COUNT_REQS``, ``COUNT_TOKENS``, ``COUNT_DECODES``
and ``COUNT_DECODE_TOKENS`` of :mod:`staticattn.kernels.staging.stage_inputs`, written by the
staging
kernels inside a graph. A kernel built for a graph whose counts are decided per replay
(``DEVICE_COUNTS``) reads them there; otherwise it takes the count its launch passed
(``static``). A ``@triton.jit`` function reads no module-level int, so the slots are
repeated below as literals; ``tests/kernels/test_step_counts.py`` holds them equal to ``COUNT_*``.
"""

from __future__ import annotations

from staticattn.kernels.runtime.deferred import lazy_jit, publish

__all__ = ["step_counts_jit"]


@lazy_jit()
def step_counts_jit(triton, tl):
    """The ``@triton.jit`` helpers ``live_reqs``, ``live_tokens``, ``live_decodes`` and
    ``live_decode_tokens``, each ``(counts, static, DEVICE_COUNTS) -> int32`` (defined
    on first use; a kernel takes them by naming this function in its
    :func:`~staticattn.kernels.runtime.deferred.lazy_jit`)."""

    @triton.jit
    def live_count(counts, slot, static, DEVICE_COUNTS: tl.constexpr):
        """``counts[slot]`` where the counts are decided on the device, else ``static``."""
        n = static
        if DEVICE_COUNTS:
            n = tl.load(counts + slot)
        return n

    publish(globals(), live_count)

    @triton.jit
    def live_reqs(counts, static, DEVICE_COUNTS: tl.constexpr):
        """The step's requests (slot ``COUNT_REQS``)."""
        return live_count(counts, 0, static, DEVICE_COUNTS)

    @triton.jit
    def live_tokens(counts, static, DEVICE_COUNTS: tl.constexpr):
        """The step's tokens (slot ``COUNT_TOKENS``)."""
        return live_count(counts, 1, static, DEVICE_COUNTS)

    @triton.jit
    def live_decodes(counts, static, DEVICE_COUNTS: tl.constexpr):
        """The step's decode requests, the first ones (slot ``COUNT_DECODES``)."""
        return live_count(counts, 2, static, DEVICE_COUNTS)

    @triton.jit
    def live_decode_tokens(counts, static, DEVICE_COUNTS: tl.constexpr):
        """The step's decode tokens, the first ones (slot ``COUNT_DECODE_TOKENS``)."""
        return live_count(counts, 3, static, DEVICE_COUNTS)

    return live_reqs, live_tokens, live_decodes, live_decode_tokens
