"""Every builder's build on a branch of its own.

A builder reads the staged step and writes only its own ``<name>.*`` buffers, so builders do
not wait for each other. Run one after the other on one stream, a graph still serialises
them: a single-program kernel of one builder (a prefill plan) holds the device while another
builder's kernels could run beside it. Each build here is issued on a side stream forked from
the current stream (after the staging kernels) and joined back before the step; captured,
the graph holds one branch per builder and the GPU runs the branches side by side. Eager,
the same streams run the builds side by side.

Python runs the builds in the builders' order either way: what one build does on the host
(views cut, errors raised) is as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["BuildBranches"]


class BuildBranches:
    """Side streams for ``count`` builders on ``device``, made once (a graph capture joins
    them through the fork's event; making streams inside a capture is not allowed)."""

    def __init__(self, device: torch.device, count: int) -> None:
        self.device = device
        self.streams = [torch.cuda.Stream(device) for _ in range(count)]

    def run(self, builders: Sequence, build: Callable[[Any], Any]) -> dict[str, Any]:
        """``{builder name: build(builder)}``, each build issued on its own side stream,
        ordered after the current stream's work so far; the current stream then waits for
        every branch."""
        main = torch.cuda.current_stream(self.device)
        for stream in self.streams:
            stream.wait_stream(main)
        metadata = {}
        for builder, stream in zip(builders, self.streams):
            with torch.cuda.stream(stream):
                metadata[builder.name] = build(builder)
        for stream in self.streams:
            main.wait_stream(stream)
        return metadata
