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
* :mod:`~staticattn.reference.swa` -- the sparse sliding-window and C128A metadata;
* :mod:`~staticattn.reference.mixed` -- both builders' ``build_mixed`` for a token bucket;
* :mod:`~staticattn.reference.dcp` -- one rank's indexer metadata under decode context
  parallelism;
* :mod:`~staticattn.reference.checksums` -- what the built-in gather consumer must write;
* :mod:`~staticattn.reference.topk_attention` -- the reference decode-context-parallel
  consumer's top-k and attention for one token.

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


