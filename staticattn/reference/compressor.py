"""Oracle of the compressor's step flag (``vllm-0.33-extras.md`` §4.3, §8), plain loops.

``c128_boundary``: whether some request's scheduled tokens cross a multiple of the ratio
(128), i.e. whether the step completes any compressed entry -- the reference computes it on
the host from the lengths and skips the C128 compress/store step when it is False.
"""

from __future__ import annotations

__all__ = ["c128_boundary"]


def c128_boundary(query_lens, seq_lens, ratio: int = 128) -> bool:
    """True when a request ``b`` with ``q_b`` new tokens ending at ``L_b`` has a position
    ``p`` in ``[L_b - q_b, L_b)`` with ``(p + 1) % ratio == 0``."""
    for q, length in zip(query_lens, seq_lens):
        for p in range(int(length) - int(q), int(length)):
            if (p + 1) % ratio == 0:
                return True
    return False
