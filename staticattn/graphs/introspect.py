"""What a captured graph holds: a node census by type through cuda-python on the raw
``cudaGraph_t``, and an optional DOT dump.

cuda-python (``cuda-bindings``) is optional: it is imported here only, and without it the
census is ``None`` and a clear message says why.
"""

from __future__ import annotations

import re
import tempfile
from collections import Counter
from graphlib import TopologicalSorter
from pathlib import Path

import torch

from staticattn.errors import BackendUnavailableError

__all__ = ["node_census", "dump_dot", "cudart_or_none", "longest_chain", "new_graph",
           "raw_node_census"]

# cudaGraphNodeType values (CUDA runtime API), named as the census reports them.
_NODE_TYPES = {
    0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "graph", 5: "empty",
    6: "event_wait", 7: "event_record", 8: "ext_semaphore_signal", 9: "ext_semaphore_wait",
    10: "mem_alloc", 11: "mem_free", 12: "batch_mem_op", 13: "conditional",
}


def cudart_or_none():
    """The cuda-python runtime module, or None when cuda-bindings is not installed."""
    try:
        from cuda.bindings import runtime
    except ImportError:
        try:
            from cuda import cudart as runtime  # older cuda-python layout
        except ImportError:
            return None
    return runtime


def new_graph() -> torch.cuda.CUDAGraph:
    """A CUDAGraph that keeps its ``cudaGraph_t`` after instantiation (needed for the
    census), on torch versions that support it."""
    try:
        return torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError:
        return torch.cuda.CUDAGraph()


def _raw_graph(graph: torch.cuda.CUDAGraph, cudart):
    raw = getattr(graph, "raw_cuda_graph", None)
    if raw is None:
        raise BackendUnavailableError("this torch has no CUDAGraph.raw_cuda_graph()")
    return cudart.cudaGraph_t(init_value=int(raw()))


def _check(result):
    err, *rest = result
    code = getattr(err, "value", err)
    if code != 0:
        raise RuntimeError(f"CUDA runtime error {err}")
    return rest[0] if len(rest) == 1 else rest


def node_census(graph: torch.cuda.CUDAGraph) -> dict[str, int] | None:
    """Count the graph's nodes by type, e.g. ``{"kernel": 4, "event_record": 1}``.

    Returns None when cuda-bindings is missing or the graph did not keep its
    ``cudaGraph_t`` (capture it with :func:`new_graph`).
    """
    cudart = cudart_or_none()
    if cudart is None:
        return None
    try:
        return raw_node_census(_raw_graph(graph, cudart))
    except (BackendUnavailableError, RuntimeError):
        return None


def raw_node_census(handle) -> dict[str, int]:
    """:func:`node_census` of a raw ``cudaGraph_t`` (needs cuda-bindings; raises
    RuntimeError on a runtime error)."""
    cudart = cudart_or_none()
    _, count = _check(cudart.cudaGraphGetNodes(handle, 0))
    nodes, _ = _check(cudart.cudaGraphGetNodes(handle, count)) if count else ([], 0)
    census: Counter[str] = Counter()
    for node in nodes or []:
        kind = _check(cudart.cudaGraphNodeGetType(node))
        census[_NODE_TYPES.get(int(getattr(kind, "value", kind)), f"type{int(kind)}")] += 1
    return dict(census)


def dump_dot(graph: torch.cuda.CUDAGraph, path: str | Path, verbose: bool = True) -> Path:
    """Write the graph as Graphviz DOT (``cudaGraphDebugDotPrint``)."""
    cudart = cudart_or_none()
    if cudart is None:
        raise BackendUnavailableError(
            "the DOT dump needs cuda-python: pip install 'staticattn[cuda]'"
        )
    flags = (1 << 0) if verbose else 0  # cudaGraphDebugDotFlagsVerbose
    path = Path(path)
    _check((*cudart.cudaGraphDebugDotPrint(_raw_graph(graph, cudart), str(path).encode(), flags),
            None))
    return path


def longest_chain(graph: torch.cuda.CUDAGraph) -> tuple[int, int] | None:
    """``(nodes on the graph's longest dependency path, nodes)``, read from its DOT dump; a
    graph captured on one stream is one chain (the two are equal), branches that run side by
    side make the first smaller. None without cuda-bindings or the graph's ``cudaGraph_t``."""
    if cudart_or_none() is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            text = dump_dot(graph, Path(tmp) / "graph.dot", verbose=False).read_text()
        except (BackendUnavailableError, RuntimeError):
            return None
    nodes = set(re.findall(r'^"([^"]+)"\s*\[', text, re.MULTILINE))
    after: dict[str, set[str]] = {n: set() for n in nodes}
    for first, then in re.findall(r'"([^"]+)"\s*->\s*"([^"]+)"', text):
        after.setdefault(then, set()).add(first)
    depth: dict[str, int] = {}
    for node in TopologicalSorter(after).static_order():
        depth[node] = 1 + max((depth[d] for d in after.get(node, ())), default=0)
    return max(depth.values(), default=0), len(depth)
