"""Which tokens write no compressed entry although their position completes one: DeepSeek
V4.1's gate of the compressed KV and index-K slots (``docs/spec/deepseek-v41.md`` §5.1,
§8.1), one rule for both slot kernels and both backends.

* A token whose own slot (the staged slot mapping) is -1 -- padding, a token the engine
  does not write -- writes no entry either.
* A token that bounded replay recomputes writes none: request ``b`` at position ``p`` with
  ``0 < replay_start[b] <= p < replay_start[b] + W``; the reference sets those tokens' slots
  to -1 in the compressed and index-K groups only (its entries are in the prefix cache).

Example (spec §11 case 4, ``W = 4``): one request, ``L = 12``, ``q = 8`` (positions 4..11),
``replay_start = 4``: the tokens at positions 4..7 write nothing.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from staticattn.kernels.runtime.deferred import lazy_jit

__all__ = ["SlotGate", "slot_gate_jit"]


class SlotGate(NamedTuple):
    """The gate of one step's compressed slots.

    Attributes
    ----------
    own_slots : int64 device ``(>= num_tokens,)``
        The staged slot mapping.
    replay_start : int32 device ``(>= num_reqs,)`` or None
        Each request's first replayed position (0: none); None: nothing replays.
    window : int
        ``W``, the replayed span.
    """

    own_slots: torch.Tensor
    replay_start: torch.Tensor | None = None
    window: int = 0

    def allows(self, positions: torch.Tensor, req: torch.Tensor) -> torch.Tensor:
        """bool ``(n,)``: which of the tokens at ``positions`` (int64 ``(n,)``) of requests
        ``req`` (int64 ``(n,)``, a valid request for every token) may write (torch)."""
        ok = self.own_slots[: positions.shape[0]] >= 0
        if self.replay_start is not None:
            start = self.replay_start[req].long()
            ok = ok & ~((start > 0) & (positions >= start) & (positions < start + self.window))
        return ok

    def launch_args(self, placeholder: torch.Tensor) -> tuple:
        """``(own_slots, replay_start, window)`` for a kernel calling ``gate_allows``, with
        ``placeholder`` (any device tensor, never read) standing in for a missing
        ``replay_start`` (int32 ``(>= num_reqs,)``); the kernel's ``REPLAY`` is
        ``replay_start is not None``."""
        replay = self.replay_start if self.replay_start is not None else placeholder
        return self.own_slots, replay, self.window


@lazy_jit()
def slot_gate_jit(triton, tl):
    """The ``@triton.jit`` helper ``gate_allows(own_slots, replay_start, window, i, pos,
    req, real, REPLAY)``: :meth:`SlotGate.allows` of the tokens ``i`` (real ones ``real``)
    at ``pos`` of requests ``req`` (a kernel takes it by naming this function in its
    :func:`~staticattn.kernels.runtime.deferred.lazy_jit`)."""

    @triton.jit
    def gate_allows(own_slots, replay_start, window, i, pos, req, real,
                    REPLAY: tl.constexpr):
        ok = tl.load(own_slots + i, mask=real, other=-1) >= 0
        if REPLAY:
            start = tl.load(replay_start + req, mask=real, other=0)
            ok = ok & ~((start > 0) & (pos >= start) & (pos < start + window))
        return ok

    return gate_allows
