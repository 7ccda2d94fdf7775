"""The static buffer arena: capacities, declarations, one allocation, frozen views."""

from staticattn.arena.arena import ALIGNMENT, Arena
from staticattn.arena.buffers import BufferDecl
from staticattn.arena.config import ArenaConfig, cdiv, round_up
from staticattn.arena.inputs import (
    NULL_BLOCK_ID,
    PAD_SLOT_ID,
    StagedCounts,
    StepInputs,
    input_buffers,
)

__all__ = [
    "ALIGNMENT", "Arena", "ArenaConfig", "BufferDecl", "NULL_BLOCK_ID", "PAD_SLOT_ID",
    "StagedCounts", "StepInputs", "cdiv", "input_buffers", "round_up",
]
