"""The real DeepSeek consumers this machine can run, as one step for a config.

* :class:`~staticattn.consumers.real.indexer_topk.IndexerTopKStep` -- DeepGEMM paged-MQA logits +
  masked top-k (one index type's indexer: V3.2's alone);
* :class:`~staticattn.consumers.real.sparse_decode.SparseDecodeStep` -- each top-k type's
  indexer, its top-k turned into the type's compressed slots, and FlashMLA's sparse FP8
  decode per layer type over the window plus the type's keys (V4, V4.1; without DeepGEMM,
  the window-only and dense layers alone).

:func:`real_consumer_step` returns the richest of these the machine can run (for the demo and
the benchmark); :func:`~staticattn.kernels.runtime.dsa_libs.available` says what is
importable. Both libraries are optional (:mod:`staticattn.kernels.runtime.dsa_libs`).

Example (GPU, both libraries built)::

    cfg = ArenaConfig.deepseek_v4(max_model_len=65536, max_num_seqs=32)
    builders = default_builders(cfg)
    arena, inputs = make_arena(cfg, builders)
    step = real_consumer_step(cfg)            # SparseDecodeStep, top-k type c4a
    with GraphManager(arena, inputs, builders, step, GraphOptions(num_kv_blocks=4096)) as gm:
        gm.capture([2, 16, 64], buckets=())  # decode graphs: these kernels serve decodes
        res = gm.run(...)                      # res.outputs = {"topk.c4a": ..., "attn": ...}
"""

from __future__ import annotations

from staticattn.arena import ArenaConfig
from staticattn.consumers.real.indexer_topk import IndexerTopKStep, index_type_unserved
from staticattn.consumers.real.sparse_decode import SparseDecodeStep
from staticattn.errors import BackendUnavailableError
from staticattn.kernels.runtime.dsa_libs import DEEP_GEMM, FLASH_MLA, available, import_error
from staticattn.model import Reads

__all__ = ["real_consumer_step"]


def real_consumer_step(config: ArenaConfig, **kwargs):
    """The real consumers this machine can run, as one step for ``config``:

    * FlashMLA and a config with a window (DeepSeek V4, V4.1): :class:`SparseDecodeStep`
      over the top-k types DeepGEMM's sm90 logits serve (V4: c4a; V4.1 on the SM90 block:
      c1a, c2a's 32-entry pages are not, :func:`index_type_unserved`), none without
      DeepGEMM;
    * DeepGEMM and one index type, without FlashMLA or a window (V3.2):
      :class:`IndexerTopKStep`.

    Raises :class:`BackendUnavailableError` naming why each library is missing, or why no
    top-k type is served, when none applies. ``kwargs`` go to the chosen class.
    """
    have = available()
    topk = [t for t in config.layer_types if t.window and t.reads is Reads.TOPK]
    served = [t.name for t in topk if index_type_unserved(config, t) is None]
    if have[FLASH_MLA] and config.has_swa:
        if not have[DEEP_GEMM]:
            return SparseDecodeStep(config, topk_types=(), **kwargs)
        if served or not topk:
            return SparseDecodeStep(config, topk_types=served, **kwargs)
    elif have[DEEP_GEMM] and len(config.index_layer_types) == 1:
        return IndexerTopKStep(config, **kwargs)
    why_flash = import_error(FLASH_MLA) or (
        "ok" if config.has_swa else "available, but this config has no SWA layers")
    why_topk = "; ".join(index_type_unserved(config, t) or f"{t.name}: served" for t in topk)
    raise BackendUnavailableError(
        f"no real consumer can run here: deep_gemm: {import_error(DEEP_GEMM) or 'ok'}; "
        f"flash_mla: {why_flash}" + (f"; top-k types: {why_topk}" if topk else ""))
