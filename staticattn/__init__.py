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
    "default_builders": "staticattn.builders",
    "IndexerMetadataBuilder": "staticattn.builders",
    "SparseSWAMetadataBuilder": "staticattn.builders",
    "GraphManager": "staticattn.graphs",
    "GraphOptions": "staticattn.graphs",
    "EagerBuild": "staticattn.graphs",
    "StagingGuard": "staticattn.graphs",
    "check_graph_safety": "staticattn.checks",
    "run_bench": "staticattn.bench",
    "check_eagerly": "staticattn.checks",
    # The typed errors (staticattn.errors), for ``except`` clauses without a deep import.
    **{name: "staticattn.errors" for name in (
        "StaticAttnError", "ConfigError", "CapacityError", "InvalidBatchError", "ArenaError",
        "GraphError", "BackendUnavailableError", "RankMismatchError", "RankFailureError",
        "RankTimeoutError", "StepSpecError")},
}

__all__ = [
    "Arena", "ArenaConfig", "ArenaError", "BackendUnavailableError", "Batch", "BufferDecl",
    "CapacityError", "ConfigError", "EagerBuild", "GraphError", "GraphManager",
    "GraphOptions", "IndexerMetadataBuilder", "InvalidBatchError", "MetadataBuilder",
    "RankFailureError", "RankMismatchError", "RankTimeoutError", "SparseSWAMetadataBuilder",
    "StagingGuard", "StaticAttnError", "StepInputs", "StepSpecError", "__version__",
    "check_eagerly", "check_graph_safety", "default_builders", "make_arena", "run_bench",
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
        default_builders,
        make_arena,
    )
    from staticattn.checks import check_eagerly, check_graph_safety
    from staticattn.errors import (
        ArenaError,
        BackendUnavailableError,
        CapacityError,
        ConfigError,
        GraphError,
        InvalidBatchError,
        RankFailureError,
        RankMismatchError,
        RankTimeoutError,
        StaticAttnError,
        StepSpecError,
    )
    from staticattn.graphs import EagerBuild, GraphManager, GraphOptions, StagingGuard
    from staticattn.staging import StepInputs
