"""The real DeepSeek consumers inside the graph: which ones can run here, and one step that
chains them.

* :class:`~staticattn.consumers.real.indexer_topk.IndexerTopKStep` -- DeepGEMM paged-MQA logits +
  masked top-k (the indexer, V3.2 and V4);
* :class:`~staticattn.consumers.real.sparse_decode.SparseDecodeStep` -- FlashMLA sparse FP8
  decode over the SWA window + C4A / dense keys (V4);
* :class:`DSADecodeStep` -- both, as one step: the indexer's top-k feeds the C4A layers;
* :class:`~staticattn.consumers.real.v41_decode.V41DecodeStep` -- DeepSeek V4.1: an indexer per
  index type, its top-k turned into the type's compressed slots, FlashMLA per layer type.

:func:`real_consumer_step` returns the richest of these the machine can run (for the demo and
the benchmark); :func:`real_consumers_available` says what is importable. Both libraries are
optional (:mod:`staticattn.kernels.runtime.dsa_libs`).

Example (GPU, both libraries built)::

    cfg = ArenaConfig.deepseek_v4(max_model_len=65536, max_num_seqs=32)
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    step = real_consumer_step(cfg)            # DSADecodeStep
    with GraphManager(arena, inputs, builders, step, GraphOptions(num_kv_blocks=4096)) as gm:
        gm.capture([2, 16, 64], buckets=())  # decode graphs: these kernels serve decodes
        res = gm.run(...)                      # res.outputs = {"topk": ..., "attn": ...}
"""

from __future__ import annotations

from typing import Any

import torch

from staticattn.arena import ArenaConfig
from staticattn.builders.batch import Batch
from staticattn.consumers.real.indexer_topk import IndexerTopKStep, index_type_unserved
from staticattn.consumers.real.sparse_decode import SparseDecodeStep
from staticattn.consumers.real.v41_decode import V41DecodeStep
from staticattn.errors import BackendUnavailableError, ConfigError
from staticattn.kernels.runtime.dsa_libs import DEEP_GEMM, FLASH_MLA, available, import_error
from staticattn.model import Reads

__all__ = ["DSADecodeStep", "V41DecodeStep", "real_consumer_step", "real_consumers_available"]


def real_consumers_available() -> dict[str, bool]:
    """``{"deep_gemm": bool, "flash_mla": bool}``: importable with the needed API, on CUDA."""
    return available()


class DSADecodeStep:
    """Indexer top-k, then sparse attention; ``(batch, md) -> {"topk": int32 (T, K),
    "attn": bf16 (T, num_layers, H, 512)}``. C4A layers (when the config has them) read the
    top-k this step just computed.

    Parameters
    ----------
    config : ArenaConfig
        DeepSeek V4-like.
    num_kv_blocks : int
        Blocks of every owned cache.
    layers_per_type : int
    indexer_kwargs, attention_kwargs : dict, optional
        Passed to :class:`IndexerTopKStep` / :class:`SparseDecodeStep`.
    """

    def __init__(self, config: ArenaConfig, *, num_kv_blocks: int = 4096,
                 layers_per_type: int = 2, indexer_kwargs: dict | None = None,
                 attention_kwargs: dict | None = None) -> None:
        self.indexer = IndexerTopKStep(config, num_kv_blocks=num_kv_blocks,
                                       **(indexer_kwargs or {}))
        with_c4a = any(t.window and t.reads is Reads.TOPK for t in config.layer_types)
        kw = dict(layers_per_type=layers_per_type, with_c4a=with_c4a,
                  num_kv_blocks=num_kv_blocks)
        kw.update(attention_kwargs or {})
        if with_c4a and self.indexer.topk != config.index_topk:
            raise ConfigError(
                f"C4A layers take index_topk={config.index_topk} keys but the indexer keeps "
                f"{self.indexer.topk} (max_model_len too short for the top-k)"
            )
        self.attention = SparseDecodeStep(config, **kw)

    def __call__(self, batch: Batch, md: dict[str, Any]) -> dict[str, torch.Tensor]:
        topk = self.indexer(batch, md)
        return {"topk": topk, "attn": self.attention(batch, md, c4a_topk=topk)}


def real_consumer_step(config: ArenaConfig, **kwargs):
    """The real consumers this machine can run, as one step for ``config``:

    * DeepGEMM and FlashMLA, a config with several index types (DeepSeek V4.1):
      :class:`V41DecodeStep` over the index types DeepGEMM's sm90 logits serve (V4.1 on the
      SM90 block: c1a; c2a's 32-entry pages are not, :func:`index_type_unserved`);
    * DeepGEMM and FlashMLA, V4-like config: :class:`DSADecodeStep`;
    * DeepGEMM only, or a config without SWA (V3.2): :class:`IndexerTopKStep`;
    * FlashMLA only, V4-like config: :class:`SparseDecodeStep` without C4A layers.

    Raises :class:`BackendUnavailableError` naming why each library is missing when none
    applies. ``kwargs`` go to the chosen class.
    """
    have = available()
    index_types = config.index_layer_types
    if len(index_types) > 1:
        served = [t.name for t in index_types if index_type_unserved(config, t) is None]
        if have[DEEP_GEMM] and have[FLASH_MLA] and served:
            return V41DecodeStep(config, index_types=served, **kwargs)
        why = "; ".join(index_type_unserved(config, t) or f"{t.name}: served"
                        for t in index_types)
        raise BackendUnavailableError(
            f"no real consumer can run here: deep_gemm: {import_error(DEEP_GEMM) or 'ok'}; "
            f"flash_mla: {import_error(FLASH_MLA) or 'ok'}; index types: {why}")
    if have[DEEP_GEMM] and have[FLASH_MLA] and config.has_swa:
        return DSADecodeStep(config, **kwargs)
    if have[DEEP_GEMM]:
        return IndexerTopKStep(config, **kwargs)
    if have[FLASH_MLA] and config.has_swa:
        return SparseDecodeStep(config, **kwargs)
    why_flash = import_error(FLASH_MLA) or "available, but this config has no SWA layers"
    raise BackendUnavailableError(
        f"no real consumer can run here: deep_gemm: {import_error(DEEP_GEMM)}; "
        f"flash_mla: {why_flash}"
    )
