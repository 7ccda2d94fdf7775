"""The sparse sliding-window metadata builder (:mod:`.builder`), its metadata record
(:mod:`.metadata`) and the FlashMLA tile-scheduler holders per layer type
(:mod:`.tile_scheduler`)."""

from staticattn.builders.swa.builder import SparseSWAMetadataBuilder
from staticattn.builders.swa.metadata import SparseSWAMetadata

__all__ = ["SparseSWAMetadata", "SparseSWAMetadataBuilder"]
