"""A step's inputs: the arena's input views, host staging, the pinned counts, and the staging
kernels' launch. (Every check of a step is :mod:`staticattn.validation`'s.)"""

from staticattn.kernels.staging.stage_inputs import (
    COUNT_DECODE_TOKENS,
    COUNT_DECODES,
    COUNT_REQS,
    COUNT_SPANS,
    COUNT_TOKENS,
)
from staticattn.staging.host_views import HostViews
from staticattn.staging.input_buffers import NULL_BLOCK_ID, PAD_SLOT_ID, input_buffers
from staticattn.staging.inputs import StagedCounts, StepInputs
from staticattn.staging.pinned_counts import PinnedCounts
from staticattn.staging.span_block import ImageSpans

__all__ = [
    "COUNT_DECODE_TOKENS", "COUNT_DECODES", "COUNT_REQS", "COUNT_SPANS", "COUNT_TOKENS",
    "HostViews", "ImageSpans", "NULL_BLOCK_ID", "PAD_SLOT_ID", "PinnedCounts", "StagedCounts",
    "StepInputs", "input_buffers",
]
