"""staticattn: CUDA-graph-first sparse-attention metadata for LLM inference.

A preallocated arena owns every buffer; builders write only into arena views; a graph
manager captures input staging + metadata build + the user's step and replays it.

The public names below are imported on first use (PEP 562), so ``import staticattn.arena``
loads the arena alone: each package pulls in only the layers beneath it.

Docstrings cite the semantics the code implements as "spec §N": a section of
``docs/spec/vllm-semantics.md``; the other files of ``docs/spec/`` are named where cited.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from staticattn.lazy import lazy_exports

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_EXPORTS = {
    "Arena": "staticattn.arena",
    "ArenaConfig": "staticattn.arena",
    "BufferDecl": "staticattn.arena",
    "StepInputs": "staticattn.staging",
    "Batch": "staticattn.builders",
    "MetadataBuilder": "staticattn.builders",
    "make_arena": "staticattn.builders",
    "IndexerMetadataBuilder": "staticattn.builders",
    "SparseSWAMetadataBuilder": "staticattn.builders",
    "GraphManager": "staticattn.graphs",
    "GraphOptions": "staticattn.graphs",
    "EagerBuild": "staticattn.graphs",
    "StagingGuard": "staticattn.graphs",
    "check_graph_safety": "staticattn.checks",
    "run_bench": "staticattn.bench",
}

__all__ = [
    "Arena", "ArenaConfig", "Batch", "BufferDecl", "EagerBuild", "GraphManager",
    "GraphOptions", "IndexerMetadataBuilder", "MetadataBuilder", "SparseSWAMetadataBuilder",
    "StagingGuard", "StepInputs", "__version__", "check_graph_safety", "make_arena",
    "run_bench",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from staticattn.arena import Arena, ArenaConfig, BufferDecl
    from staticattn.bench import run_bench
    from staticattn.builders import (
        Batch,
        IndexerMetadataBuilder,
        MetadataBuilder,
        SparseSWAMetadataBuilder,
        make_arena,
    )
    from staticattn.checks import check_graph_safety
    from staticattn.graphs import EagerBuild, GraphManager, GraphOptions, StagingGuard
    from staticattn.staging import StepInputs
