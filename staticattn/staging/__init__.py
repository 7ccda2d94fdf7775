"""A step's inputs: the arena's input views, host staging, the pinned counts, and the staging
kernels' launch. (Every check of a step is :mod:`staticattn.validation`'s.)"""

from staticattn.staging.host_views import HostViews
from staticattn.staging.input_buffers import PAD_SLOT_ID, input_buffers
from staticattn.staging.inputs import StagedCounts, StepInputs

__all__ = ["HostViews", "PAD_SLOT_ID", "StagedCounts", "StepInputs", "input_buffers"]
