"""Compressed-KV metadata of the kv-source layer types (DeepSeek V4.1's c1a and c2a, V4's C4A
and C128A): the builder (:mod:`.builder`) and what it hands the step (:mod:`.metadata`)."""

from staticattn.builders.compressed.builder import (
    CompressedMetadataBuilder,
    kv_source_types,
    ring_capacity,
)
from staticattn.builders.compressed.metadata import CompressedKVMetadata, CompressedMetadata

__all__ = ["CompressedKVMetadata", "CompressedMetadata", "CompressedMetadataBuilder",
           "kv_source_types", "ring_capacity"]
