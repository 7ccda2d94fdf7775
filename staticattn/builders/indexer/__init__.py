"""The sparse-attention indexer's metadata builder and what it hands the step: the builder
(:mod:`.builder`), its decode layout (:mod:`.decode_layout`), its prefill chunks (:mod:`.prefill`)
and the metadata records (:mod:`.metadata`)."""

from staticattn.builders.indexer.builder import IndexerMetadataBuilder
from staticattn.builders.indexer.metadata import (
    IndexerDecodeMetadata,
    IndexerMetadata,
    IndexerPrefillChunkMetadata,
)

__all__ = ["IndexerDecodeMetadata", "IndexerMetadata", "IndexerMetadataBuilder",
           "IndexerPrefillChunkMetadata"]
