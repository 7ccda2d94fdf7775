"""The reference engine's batch utilities for attention backends, on our
:class:`~staticattn.builders.batch.Batch`: the decode/prefill split (:mod:`.split`), the
reorder that makes it possible (:mod:`.reorder`), prefill chunking (:mod:`.chunking`),
chunked local attention (:mod:`.local_attention`), causal-conv1d launch metadata
(:mod:`.conv1d`), KV-sharing fast prefill (:mod:`.fast_prefill`), context-parallel lengths
(:mod:`.context_parallel`), speculative-decode reshapes (:mod:`.spec_decode`) and the KV
cache layout (:mod:`.kv_layout`). The builders use the split and the chunking; the rest
serves engines that need them beside our metadata."""
