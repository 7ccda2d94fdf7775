"""Why no Python collection may run inside a capture (GPU; ``staticattn.graphs.python_gc``).

A pinned host block is copied from on a stream, then becomes cyclic garbage while a capture
runs on that same stream. Torch's host allocator records the block's release event on each
stream that used it; on a capturing stream the event becomes a node of the capture, is never
recorded, and the next pinned allocation of that size class fails querying it.

    python scripts/pinned_capture_hazard.py collect   # a collection mid-capture: fails
    python scripts/pinned_capture_hazard.py paused    # the same garbage under gc_paused: ok

Run each in its own process: the failure stays with the process.
"""

from __future__ import annotations

import gc
import sys
from contextlib import nullcontext

import torch

from staticattn.graphs.python_gc import gc_paused


def main(mode: str) -> str:
    size = 1 << 20
    stream = torch.cuda.Stream()
    dev = torch.zeros(size, dtype=torch.uint8, device="cuda")
    host = torch.ones(size, dtype=torch.uint8, pin_memory=True)
    with torch.cuda.stream(stream):
        dev.copy_(host, non_blocking=True)  # the block's streams now hold `stream`
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with gc_paused() if mode == "paused" else nullcontext(), torch.cuda.graph(graph,
                                                                               stream=stream):
        cycle = [host]
        cycle.append(cycle)
        del host, cycle  # the block is now cyclic garbage
        for _ in range(20_000):  # churn that lets an automatic collection fire
            junk = []
            junk.append(junk)
        if mode == "collect":
            gc.collect()  # and make sure one does
        dev.add_(1)
    del junk
    gc.collect()
    torch.cuda.synchronize()
    try:
        torch.empty(size, dtype=torch.uint8, pin_memory=True)
    except Exception as exc:  # noqa: BLE001 - the error is the finding
        return f"{mode}: the next pinned allocation of that size: {type(exc).__name__}: " \
               f"{str(exc).splitlines()[0]}"
    return f"{mode}: the next pinned allocation of that size: ok"


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("collect", "paused"):
        sys.exit("usage: python scripts/pinned_capture_hazard.py collect|paused")
    print(main(sys.argv[1]))
