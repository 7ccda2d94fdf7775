"""A step's inputs: the arena's input views, host staging, and the staging kernels' launch."""

from staticattn.kernels.staging.stage_inputs import (
    COUNT_DECODE_TOKENS,
    COUNT_DECODES,
    COUNT_REQS,
    COUNT_SPANS,
    COUNT_TOKENS,
)
from staticattn.staging.input_buffers import NULL_BLOCK_ID, PAD_SLOT_ID, input_buffers
from staticattn.staging.inputs import HostViews, StagedCounts, StepInputs
from staticattn.staging.span_block import ImageSpans
from staticattn.validation.image_spans import check_image_spans
from staticattn.validation.replay_start import check_replay_start, replay_start_array

__all__ = [
    "COUNT_DECODE_TOKENS", "COUNT_DECODES", "COUNT_REQS", "COUNT_SPANS", "COUNT_TOKENS",
    "HostViews",
    "ImageSpans", "NULL_BLOCK_ID", "PAD_SLOT_ID", "StagedCounts", "StepInputs",
    "check_image_spans", "check_replay_start", "input_buffers",
    "replay_start_array",
]
