"""A step's inputs: the arena's input views, host staging, and the staging kernels' launch."""

from staticattn.staging.buffers import NULL_BLOCK_ID, PAD_SLOT_ID, input_buffers
from staticattn.staging.inputs import HostViews, StagedCounts, StepInputs

__all__ = [
    "HostViews", "NULL_BLOCK_ID", "PAD_SLOT_ID", "StagedCounts", "StepInputs", "input_buffers",
]
