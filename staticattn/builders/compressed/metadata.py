"""What the compressed-KV builder hands the step: per kv-source layer type, views of arena
buffers and static ints (``docs/spec/deepseek-v41.md`` §5-§7).

The same classes come out of the eager, the decode and the mixed build, so the step never
needs to know which one ran.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from staticattn.errors import InvalidBatchError
from staticattn.kernels.compressed.topk_operand import global_topk_slots
from staticattn.kernels.dcp.ownership import DCPShard

__all__ = ["CompressedKVMetadata", "CompressedMetadata"]


@dataclass(slots=True)
class CompressedKVMetadata:
    """One kv-source layer type's compressed cache for the step.

    Attributes
    ----------
    layer_type : str
        The type ("c2a").
    compress_ratio : int
        ``R``.
    entries_per_block : int
        ``S = block_size // R``: entries per page of ``block_table``.
    block_table : int32 device ``(num_reqs, C)``
        The table of the type's compressed KV cache (its group's, or the main one; under
        decode context parallelism the rank's local blocks).
    slot_mapping : int64 device ``(num_tokens,)``
        The compressed slot each token writes, -1 = none (padded tokens -1; under decode
        context parallelism the entries another rank holds too).
    entry_counts : int32 device ``(num_tokens,)``
        ``n_c(p) = floor((p + 1) / R)`` per token; 0 for padded tokens. Global under decode
        context parallelism (the indexers hold the rank's local lengths).
    ring_slot_mapping : int64 device ``(num_tokens,)`` or None
        The compressor-ring slot of each token (a type with a ring of its own): -1 for the
        null ring block and for padded tokens.
    ring_capacity : int
        Ring rows per request (0 without a ring).
    decode_topk_indices : int32 device ``(Td, 1, K)`` or None
        Filled by :meth:`CompressedMetadata.decode_topk` (a top-k type only).
    decode_topk_lens : int32 device ``(Td,)`` or None
        Likewise.
    entry_written : int32 device ``(1,)`` or None
        A type that reads every entry (C128A): 1 when some token of the step writes an
        entry (``slot_mapping >= 0``: a real token with ``(p + 1) % R == 0``), else 0 -- the
        reference's ``CompressorMetadata.c128_boundary`` as a device flag, so a compressor
        kernel can skip its store on the device inside a graph. None for other types.
    dcp : DCPShard or None
        This rank's shard of the type's entries (interleave ``I // R``) under decode context
        parallelism; None when every entry is this rank's.
    """

    layer_type: str
    compress_ratio: int
    entries_per_block: int
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    entry_counts: torch.Tensor
    ring_slot_mapping: torch.Tensor | None
    ring_capacity: int
    decode_topk_indices: torch.Tensor | None
    decode_topk_lens: torch.Tensor | None
    entry_written: torch.Tensor | None = None
    dcp: DCPShard | None = None


@dataclass(slots=True)
class CompressedMetadata:
    """Every kv-source type's :class:`CompressedKVMetadata` for one step.

    Attributes
    ----------
    types : dict of str to CompressedKVMetadata
        By type name, in the table's type order.
    token_to_req : int32 device ``(num_tokens,)``
        Request of each token (padded tokens: 0).
    slot_mapping : int64 device ``(num_tokens,)``
        The staged (own) slot of each token; -1 marks an invalid token.
    num_decode_tokens : int
        Decode rows of the step (``Td``; a mixed build: the bucket's capacity, the exact
        count being ``step_counts[3]``).
    step_counts : int32 device ``(4,)`` or None
        Set by the mixed build: the step's real ``[k, nt, D, Td]``.
    backend : str
        The kernel backend :meth:`decode_topk` launches on.
    """

    types: dict[str, CompressedKVMetadata]
    token_to_req: torch.Tensor
    slot_mapping: torch.Tensor
    num_decode_tokens: int
    step_counts: torch.Tensor | None
    backend: str

    def decode_topk(self, layer_type: str, topk_indices: torch.Tensor, *,
                    short_context_fill: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The decode operand of one layer of ``layer_type`` from its top-k (spec §7.1):
        global slots of the type's compressed cache and their counts, written into the
        type's ``decode_topk_indices`` / ``decode_topk_lens`` and returned. Graph-safe: one
        kernel, fixed views; a layer calls it before its attention.

        Parameters
        ----------
        layer_type : str
            A top-k type of :attr:`types` ("c1a").
        topk_indices : int32 device ``(>= num_decode_tokens, K)``
            The indexer's request-local top-k rows, decode tokens first (-1 = none).
        short_context_fill : bool
            Decide the short-context fill per row on the device (``vllm-0.33-extras.md``
            §4): a token whose ``n_c(p)`` (:attr:`CompressedKVMetadata.entry_counts`) fits
            ``K`` reads all its ``n`` entries, ``0..n-1``, whatever its top-k row holds --
            so the layer may leave such rows unscored. The set equals the scored one.

        Under decode context parallelism (:attr:`CompressedKVMetadata.dcp`) the rows hold
        the merged global top-k (request-global entry ids, the same on every rank) and the
        result is this rank's share: its entries at their local slots, the others -1 and not
        counted.

        Returns
        -------
        indices : int32 ``(Td, 1, K)``
            ``bt[b, k // S] * S + k % S`` per ``k >= 0`` (under DCP: per ``k`` this rank
            holds, at its local index), else -1; rows of invalid tokens all -1.
        lens : int32 ``(Td,)``
            Entries ``>= 0`` per row, 0 for invalid tokens.
        """
        kv = self.types.get(layer_type)
        if kv is None or kv.decode_topk_indices is None:
            raise InvalidBatchError(
                f"layer type {layer_type!r} is not a top-k kv-source type of this step; "
                f"those are {[n for n, t in self.types.items() if t.decode_topk_lens is not None]}"
            )
        td, out = self.num_decode_tokens, kv.decode_topk_indices
        if topk_indices.dim() != 2 or topk_indices.shape[1] != out.shape[2] or (
                topk_indices.shape[0] < td):
            raise InvalidBatchError(
                f"topk_indices must be ({td}+, {out.shape[2]}) (decode rows, index_topk), got "
                f"{tuple(topk_indices.shape)}"
            )
        global_topk_slots(
            self.backend, topk_indices, self.token_to_req, self.slot_mapping, kv.block_table,
            out.view(out.shape[0], out.shape[2]), kv.decode_topk_lens, num_rows=td,
            entries_per_block=kv.entries_per_block, step_counts=self.step_counts,
            entry_counts=kv.entry_counts if short_context_fill else None, dcp=kv.dcp,
        )
        return out, kv.decode_topk_lens
