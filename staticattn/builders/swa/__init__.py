"""The sparse sliding-window builder (:mod:`.builder`), its metadata record
(:mod:`.metadata`), buffers and widths (:mod:`.declarations`), bound views (:mod:`.outputs`),
prefill chunk plans (:mod:`.chunk_plan`), per-layer combined and FlashInfer rows
(:mod:`.combined`), the FlashMLA tile-scheduler holders per layer type
(:mod:`.tile_scheduler`), and DeepSeek V4.1's decoder-replay sub-batch (:mod:`.decoder_replay`) and
DSpark draft metadata (:mod:`.draft`)."""

from staticattn.builders.swa.builder import SparseSWAMetadataBuilder
from staticattn.builders.swa.chunk_plan import PrefillChunkPlan
from staticattn.builders.swa.combined import IndexRows
from staticattn.builders.swa.decoder_replay import DecoderReplayBuilder, DecoderReplayMetadata
from staticattn.builders.swa.draft import DraftSWAMetadata, DraftSWAMetadataBuilder
from staticattn.builders.swa.metadata import SparseSWAMetadata

__all__ = ["DecoderReplayBuilder", "DecoderReplayMetadata", "DraftSWAMetadata",
           "DraftSWAMetadataBuilder", "IndexRows", "PrefillChunkPlan", "SparseSWAMetadata",
           "SparseSWAMetadataBuilder"]
