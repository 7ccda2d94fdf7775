"""What the sparse sliding-window builder declares, and the widths of its rows.

Widths (``docs/spec/deepseek-v41.md`` §7.2-§7.3, ``vllm-0.33-extras.md`` §2.2, §5):

* :func:`prefill_swa_width` -- the paged prefill SWA rows, ``W + mit`` (``mit =
  max_image_tokens``, 0 for text models; image spans widen a window by up to ``mit``);
* :func:`combined_width` -- a layer type's prefill combined rows in workspace coordinates,
  ``round_up(K + W + mit, 128)`` with ``K`` its top-k width (640 for V4.1-Flash, 1152 for
  ``K = 1024``; ``round_up(W, 128)`` for SWA-only layers);
* :func:`flashinfer_width` -- the FlashInfer rows in paged coordinates,
  ``W + round_up(K, 4)``.

Chunk plans (``vllm-0.33-extras.md`` §2.5) are made for every windowed layer type of the
model (:func:`plan_types`); a type counts its compressed entries in the plan when it reads
any (the table's :attr:`~staticattn.model.LayerType.compressed`: V4's ratio 1 is the
SWA-only row, ``R = 0``, while V4.1's is c1a), which is the reference's ``has_compressed``
(``R > 1`` for V4, ``R > 0`` for V4.1) as data.
"""

from __future__ import annotations

import torch

from staticattn.arena import ArenaConfig, BufferDecl
from staticattn.arena.config import round_up
from staticattn.errors import ConfigError
from staticattn.model import LayerType, Reads

__all__ = ["PREFILL_CHUNK_SIZE", "combined_width", "dense_prefill_chunk_rows",
           "flashinfer_width", "plan_ratio", "plan_types", "prefill_swa_width",
           "row_scratch_width", "swa_buffers"]

#: ``C`` of the chunk plan's area budget (the reference's ``PREFILL_CHUNK_SIZE``): it scales
#: an area, it is not a request count.
PREFILL_CHUNK_SIZE = 4


def prefill_swa_width(config: ArenaConfig) -> int:
    """Columns of a paged prefill SWA row: ``W + max_image_tokens`` (``vllm-0.33-extras.md``
    §3.5: every step of a vision model, spans or not)."""
    return config.sliding_window + config.max_image_tokens


def topk_columns(config: ArenaConfig, layer_type: LayerType) -> int:
    """``K`` of a type's combined rows: ``index_topk`` for a top-k type, 0 for SWA-only;
    a type reading every entry takes ``maxC`` (callers may pass a narrower active width)."""
    return layer_type.topk_width(config.index_topk, config.max_model_len)


def combined_width(config: ArenaConfig, layer_type: LayerType, topk: int | None = None) -> int:
    """``round_up(K + W + mit, 128)`` (``vllm-0.33-extras.md`` §5.1; ``mit`` 0 for text
    models): FlashMLA's sparse prefill takes multiples of 128."""
    k = topk_columns(config, layer_type) if topk is None else topk
    return round_up(k + prefill_swa_width(config), 128)


def flashinfer_width(config: ArenaConfig, layer_type: LayerType) -> int:
    """``W + round_up(K, 4)``."""
    return config.sliding_window + round_up(topk_columns(config, layer_type), 4)


def plan_types(config: ArenaConfig) -> tuple[LayerType, ...]:
    """The windowed layer types, one chunk plan each, in the table's order."""
    return tuple(t for t in config.layer_types if t.window)


def plan_ratio(layer_type: LayerType) -> int:
    """The ratio a type's plan counts compressed entries by: 0 when it reads none."""
    return layer_type.compress_ratio if layer_type.compressed else 0


def dense_prefill_chunk_rows(config: ArenaConfig) -> int:
    """``Rc``, the C128A prefill rows one workspace chunk holds: the
    ``dense_prefill_workspace_bytes`` over ``4 * maxC`` bytes a row, at least one row (a
    budget below one row still gets one), at most ``max_num_batched_tokens``; 0 without a
    type that reads every entry. V4 at its defaults: 16 MiB over 32 KiB rows = 512 rows, 16
    chunks for a step of 8,192 prefill tokens; at a 2M context 256 rows of 64 KiB."""
    width = config.dense_width
    if not width:
        return 0
    rows = config.dense_prefill_workspace_bytes // (4 * width)
    return min(max(rows, 1), config.max_num_batched_tokens)


def row_scratch_width(config: ArenaConfig) -> int:
    """Widest per-layer row the builder's scratch serves: the combined and FlashInfer rows
    of every windowed type but one reading every entry (whose ``maxC``-wide rows take a
    caller's buffer or a narrower active width)."""
    served = [t for t in plan_types(config) if t.reads is not Reads.ALL]
    widths = [combined_width(config, t) for t in served]
    widths += [flashinfer_width(config, t) for t in served]
    return max(widths, default=combined_width(config, plan_types(config)[0], 0))


def swa_buffers(config: ArenaConfig, prefix: str = "swa", *,
                row_scratch: bool = True) -> list[BufferDecl]:
    """The ``swa.*`` declarations (``prefix.*`` for another prefix; without the row scratch
    when ``row_scratch`` is False) (``Td = max_decode_tokens``, ``T =
    max_num_batched_tokens``, ``R = max_num_seqs``, ``W = sliding_window``, ``Wp =``
    :func:`prefill_swa_width`, ``maxC = dense_width``, ``J`` = windowed types):

    * ``swa.is_valid_token`` bool ``(T,)``;
    * ``swa.decode_swa_indices`` int32 ``(Td, 1, W)``, ``swa.decode_swa_lens`` int32
      ``(Td,)``;
    * ``swa.prefill_gather_lens``, ``swa.prefill_seq_lens`` int32 ``(R,)``;
    * ``swa.prefill_swa_indices`` int32 ``(T, 1, Wp)``, ``swa.prefill_swa_lens`` int32
      ``(T,)``: the paged prefill rows;
    * ``swa.prefill_chunks`` int32 ``(J, R, 4)``, ``swa.prefill_num_chunks`` int32
      ``(J,)``: the chunk plans;
    * ``swa.row_scratch`` int32 ``(T * row_scratch_width,)``, ``swa.row_scratch_lens``
      int32 ``(T,)``: one layer's combined or FlashInfer rows at a time;
    * with a layer type that reads every compressed entry (C128A, the table's
      :attr:`~staticattn.model.Reads.ALL`): ``swa.dense_decode_indices`` int32
      ``(Td, 1, maxC)``, ``swa.dense_decode_lens`` int32 ``(Td,)``, and the prefill rows'
      workspace, one chunk of prefill tokens at a time (:mod:`.dense_prefill`):
      ``swa.dense_prefill_indices`` int32 ``(Rc, maxC)``, ``swa.dense_prefill_lens`` int32
      ``(Rc,)``, ``Rc =`` :func:`dense_prefill_chunk_rows` (512 for
      V4 at its defaults: 16 MiB where a row per token of the step took 256 MiB). Index
      rows start as -1: every writer keeps the entries at or past a row's length at -1.
    """
    if config.sliding_window is None:
        raise ConfigError(
            "the sparse SWA builder needs config.sliding_window (128 for DeepSeek V4); "
            "this config has none"
        )
    td, t, w = config.max_decode_tokens, config.max_num_batched_tokens, config.sliding_window
    r, plans = config.max_num_seqs, len(plan_types(config))
    shapes = [
        ("is_valid_token", (t,), torch.bool, 0),
        ("decode_swa_indices", (td, 1, w), torch.int32, -1),
        ("decode_swa_lens", (td,), torch.int32, 0),
        ("prefill_gather_lens", (r,), torch.int32, 0),
        ("prefill_seq_lens", (r,), torch.int32, 0),
        ("prefill_swa_indices", (t, 1, prefill_swa_width(config)), torch.int32, -1),
        ("prefill_swa_lens", (t,), torch.int32, 0),
        ("prefill_chunks", (plans, r, 4), torch.int32, 0),
        ("prefill_num_chunks", (plans,), torch.int32, 0),
    ]
    if row_scratch:
        shapes += [("row_scratch", (t * row_scratch_width(config),), torch.int32, -1),
                   ("row_scratch_lens", (t,), torch.int32, 0)]
    if config.dense_layer_type is not None:
        max_c, chunk_rows = config.dense_width, dense_prefill_chunk_rows(config)
        shapes += [
            ("dense_decode_indices", (td, 1, max_c), torch.int32, -1),
            ("dense_decode_lens", (td,), torch.int32, 0),
            ("dense_prefill_indices", (chunk_rows, max_c), torch.int32, -1),
            ("dense_prefill_lens", (chunk_rows,), torch.int32, 0),
        ]
    return [BufferDecl(f"{prefix}.{name}", shape, dtype, fill=fill)
            for name, shape, dtype, fill in shapes]
