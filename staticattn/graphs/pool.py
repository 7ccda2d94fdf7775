"""The memory pool graphs share, the stream they are captured on and the one they replay on."""

from __future__ import annotations

import torch

from staticattn.errors import GraphError
from staticattn.graphs.graph_launch import cuda_index

__all__ = ["GraphPool"]


class GraphPool:
    """One graph memory pool with its capture stream and replay stream, on one device.

    Takes the device. Owns ``handle`` (a ``torch.cuda.graph_pool_handle()``), the side
    stream captures run on (``capture_stream``) and the stream every graph replays on
    (``stream``: the one current when the pool opened); all three are None until
    :meth:`open`. Offers :meth:`require_cuda`, :meth:`open`, :meth:`held_bytes` and
    :meth:`close`. Several managers may share one pool (one per context bucket): graphs
    captured into one pool on one stream reuse each other's free memory.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.handle = None
        self.capture_stream: torch.cuda.Stream | None = None
        self.stream: torch.cuda.Stream | None = None

    def require_cuda(self, fallback: str) -> None:
        """Raise :class:`GraphError` unless the device is CUDA; ``fallback`` says what
        still works without graphs."""
        if self.device.type != "cuda":
            raise GraphError(f"CUDA graphs need a CUDA arena; this one is on "
                             f"{self.device} ({fallback})")

    def open(self) -> None:
        """Make, on first use, the pool, the capture stream, and fix the replay stream."""
        if self.handle is None:
            self.handle = torch.cuda.graph_pool_handle()
            self.capture_stream = torch.cuda.Stream(self.device)
            self.stream = torch.cuda.current_stream(self.device)

    def held_bytes(self) -> int:
        """Bytes the caching allocator holds for this pool (0 before :meth:`open`): the
        sizes of the segments it owns. The device's reserved memory cannot tell:
        ``torch.cuda.graph`` empties the cache before each capture, so the pool grows while
        the total may shrink."""
        if self.handle is None:
            return 0
        index, want = cuda_index(self.device), tuple(self.handle)
        return sum(s["total_size"] for s in torch.cuda.memory_snapshot()
                   if s["device"] == index and tuple(s.get("segment_pool_id", ())) == want)

    def close(self) -> None:
        """Let go of the pool (its memory goes with the last graph captured into it)."""
        self.handle = None
