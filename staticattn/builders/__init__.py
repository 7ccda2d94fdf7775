"""Batch description, validation, host-side planning and the metadata builders."""

from staticattn.arena import ArenaConfig
from staticattn.builders.attention_utils.chunking import (
    split_indexer_prefill_chunks,
    split_prefill_chunks,
)
from staticattn.builders.attention_utils.context_parallel import get_dcp_local_seq_lens
from staticattn.builders.attention_utils.conv1d import (
    CONV1D_BLOCK_M,
    compute_causal_conv1d_metadata,
    conv1d_buffers,
    max_conv1d_programs,
)
from staticattn.builders.attention_utils.fast_prefill import make_kv_sharing_fast_prefill_batch
from staticattn.builders.attention_utils.kv_layout import (
    KV_CACHE_LAYOUT_ENV,
    KVCacheLayout,
    get_kv_cache_layout,
    is_valid_kv_cache_layout,
    set_kv_cache_layout,
)
from staticattn.builders.attention_utils.local_attention import make_local_attention_virtual_batches
from staticattn.builders.attention_utils.reorder import (
    ListReorderState,
    ReorderState,
    reorder_batch_to_split_decodes_and_prefills,
    reorder_region,
)
from staticattn.builders.attention_utils.spec_decode import (
    reshape_attn_output_for_spec_decode,
    reshape_query_for_spec_decode,
)
from staticattn.builders.attention_utils.split import (
    split_decodes_and_prefills,
    split_decodes_prefills_and_extends,
)
from staticattn.builders.batch import Batch
from staticattn.builders.batch_checks import validate
from staticattn.builders.compressed.builder import CompressedMetadataBuilder, compressed_served
from staticattn.builders.contract import MetadataBuilder, make_arena
from staticattn.builders.indexer.builder import IndexerMetadataBuilder
from staticattn.builders.swa.builder import SparseSWAMetadataBuilder
from staticattn.builders.swa.decoder_replay import DecoderReplayBuilder
from staticattn.builders.swa.draft import DraftSWAMetadataBuilder
from staticattn.validation.host_arrays import validate_host_step

__all__ = [
    "Batch", "CompressedMetadataBuilder", "DecoderReplayBuilder", "DraftSWAMetadataBuilder",
    "IndexerMetadataBuilder", "MetadataBuilder", "SparseSWAMetadataBuilder", "default_builders",
    "make_arena",
    "CONV1D_BLOCK_M", "KV_CACHE_LAYOUT_ENV", "KVCacheLayout", "ListReorderState",
    "ReorderState", "compute_causal_conv1d_metadata", "conv1d_buffers",
    "get_dcp_local_seq_lens", "get_kv_cache_layout", "is_valid_kv_cache_layout",
    "make_kv_sharing_fast_prefill_batch", "make_local_attention_virtual_batches",
    "max_conv1d_programs", "reorder_batch_to_split_decodes_and_prefills", "reorder_region",
    "reshape_attn_output_for_spec_decode", "reshape_query_for_spec_decode",
    "set_kv_cache_layout", "split_decodes_and_prefills", "split_decodes_prefills_and_extends",
    "split_indexer_prefill_chunks", "split_prefill_chunks", "validate", "validate_host_step",
]


def default_builders(config: ArenaConfig) -> list[MetadataBuilder]:
    """Fresh builders serving every layer type of ``config``: an indexer per index-owning
    type (one unnamed ``"indexer"`` when the model has one such type, ``"indexer.<type>"``
    each when it has several: DeepSeek V4.1), the compressed-KV builder when a type owns a
    compressed KV cache (DeepSeek V4, V4.1; under decode context parallelism V4.1 only:
    :func:`~staticattn.builders.compressed.builder.compressed_served`), the sparse SWA
    builder when a type attends a window.

    >>> cfg = ArenaConfig.preset("deepseek-v4.1-flash", device="cpu")
    >>> [b.name for b in default_builders(cfg)]
    ['indexer.c1a', 'indexer.c2a', 'compressed', 'swa']
    """
    index_types = config.index_layer_types
    builders: list[MetadataBuilder] = (
        [IndexerMetadataBuilder(t.name) for t in index_types] if len(index_types) > 1
        else [IndexerMetadataBuilder()])
    if compressed_served(config):
        builders.append(CompressedMetadataBuilder())
    if config.has_swa:
        builders.append(SparseSWAMetadataBuilder())
    return builders
