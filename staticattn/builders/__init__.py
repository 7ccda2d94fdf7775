"""Batch description, validation, host-side planning and the metadata builders."""

from staticattn.builders.base import MetadataBuilder, make_arena
from staticattn.builders.batch import Batch

__all__ = ["Batch", "MetadataBuilder", "make_arena"]
