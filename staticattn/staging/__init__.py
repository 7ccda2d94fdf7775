"""A step's inputs: the arena's input views, host staging, and the staging kernel's launch."""

from staticattn.staging.buffers import NULL_BLOCK_ID, PAD_SLOT_ID, input_buffers
from staticattn.staging.inputs import StagedCounts, StepInputs

__all__ = ["NULL_BLOCK_ID", "PAD_SLOT_ID", "StagedCounts", "StepInputs", "input_buffers"]
