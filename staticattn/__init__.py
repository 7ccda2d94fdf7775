"""staticattn: CUDA-graph-first sparse-attention metadata for LLM inference.

A preallocated arena owns every buffer; builders write only into arena views; a graph
manager captures input staging + metadata build + the user's step in one CUDA graph per
uniform batch size.
"""

from staticattn.arena import Arena, ArenaConfig, BufferDecl, StepInputs
from staticattn.builders import Batch, MetadataBuilder, make_arena

__version__ = "0.1.0"

__all__ = [
    "Arena", "ArenaConfig", "Batch", "BufferDecl", "MetadataBuilder", "StepInputs",
    "make_arena", "__version__",
]
