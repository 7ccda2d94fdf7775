"""The reference: what every builder output must be, as plain Python loops from the spec.

An independent oracle, written from the words of the specification (vLLM v0.20.2's semantics
with staticattn's documented deviations) one loop at a time, over Python ints and lists: no
vectorised tricks, nothing of :mod:`staticattn.kernels` or :mod:`staticattn.builders`. The
test suite, the demo and the checker compare the builders' metadata with it, field by
field. Slow on purpose (a long context costs a long loop); use it on small steps.

One module per concern:

* :mod:`~staticattn.reference.step` -- :class:`HostStep`, one step as the host knows it
  (the input of every function here);
* :mod:`~staticattn.reference.indexer` -- the indexer metadata (split, compressed slots,
  decode layout, paged-MQA schedule, prefill chunks);
* :mod:`~staticattn.reference.swa` -- the sparse sliding-window and dense metadata;
* :mod:`~staticattn.reference.mixed` -- both builders' ``build_mixed`` for a token bucket;
* :mod:`~staticattn.reference.dcp_indexer` -- one rank's indexer metadata under decode context
  parallelism;
* :mod:`~staticattn.reference.v41_dcp` -- one rank's DeepSeek V4.1 metadata under decode context
  parallelism (sharded compressed and index-K slots, the decode operand's share, both
  indexers);
* :mod:`~staticattn.reference.checksums` -- what the built-in gather consumer must write;
* :mod:`~staticattn.reference.topk_attention` -- the reference decode-context-parallel
  consumer's top-k and attention for one token;
* :mod:`~staticattn.reference.v41_swa` -- the SWA builder's paged prefill rows, bounded
  replay starts, gather lengths and chunk plans (V4 and V4.1);
* :mod:`~staticattn.reference.v41_rows` -- a layer's prefill combined rows and FlashInfer
  rows;
* :mod:`~staticattn.reference.v41_decoder_replay` -- the decoder-replay sub-batch and the DSpark
  draft rows.
* :mod:`~staticattn.reference.short_topk` -- the short-context top-k fill, per row;
* :mod:`~staticattn.reference.compressor` -- the compressor's step flag (``c128_boundary``);
* :mod:`~staticattn.reference.dcp_topk` -- the exact top-k merge of decode and prefill rows
  under decode context parallelism;
* :mod:`~staticattn.reference.dcp_shares` -- one rank's SWA window and dense entries when
  they are sharded instead of replicated;
* :mod:`~staticattn.reference.pcp_layout` -- prefill context parallelism: the token split,
  each rank's rows and metadata, the gathered layout, restore index and slot mapping;
* :mod:`~staticattn.reference.pcp_chunk_plan` -- its prefill-row KV extents: the PCP-only
  indexer rows, the PCP+DCP global chunk plan, the FlashMLA-sparse workspace rows;
* :mod:`~staticattn.reference.pcp_ring` -- its DeepSeek V4.1 cache inputs: gathered
  positions, compressed slots, the compressor-ring links.

Example::

    from staticattn.reference import indexer, swa
    from staticattn.reference.step import HostStep

    step = HostStep(query_lens, seq_lens, slot_mapping, block_table, swa_block_table,
                    num_reqs_padded=len(query_lens), num_tokens_padded=int(query_lens.sum()))
    indexer.assert_matches(meta["indexer"], indexer.indexer_metadata(cfg, step), step, arena)
    swa.assert_matches(meta["swa"], swa.expected_for_step(cfg, step))
"""

from staticattn.reference.step import HostStep

__all__ = ["HostStep"]


