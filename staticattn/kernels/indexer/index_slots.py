"""The compressed indexer-K slot of every token (spec §4.5).

With compress ratio ``R > 1`` the indexer's K cache stores one entry per ``R`` consecutive
positions, ``S = block_size // R`` entries per block. Only the token that *completes* a group
writes: the token at absolute position ``p`` writes iff ``(p + 1) % R == 0``, into compressed
index ``k = p // R``, i.e. slot ``block_table[b, k // S] * S + k % S``; every other token gets
``-1`` (do not write).

Example A (the reference engine's regression test): ``R = 4``, ``S = 64``, one request with
``L = 280``, ``q = 40`` (positions 240..279), block row ``[5, 7]``: positions 243, 247, ..., 279
write ``k = 60..69`` -> slots ``380..383`` (block 5) and ``448..453`` (block 7); the other 30
tokens get -1.

Tokens are read through the staging kernel's ``positions`` and ``token_to_req`` views; tokens
past the real ones (``t >= query_start_loc[num_reqs]``, graph padding) always get -1.

DeepSeek V4.1's rule (vLLM 0.33, ``docs/spec/deepseek-v41.md`` §5.1-§5.2), with a ``gate``
(:class:`~staticattn.kernels.compressed.slot_gate.SlotGate`): a token whose own slot is -1
(padding, a token the engine does not write) writes no entry either, nor a token bounded
replay recomputes; ``R = 1`` then gives the token's own entry ``k = p``, ``S = block_size``: slot
``bt[b, p // S] * S + p % S``. Example (spec §11 case 1, c2a index K, ``S = 4``): request 0,
``L = q = 5``, row ``[31]``: ``[-1, 124, -1, 125, -1]``.

Under decode context parallelism (``dcp``) each rank writes only the entries it holds:
entry ``k`` lives on rank ``(k // J) % W`` at local index ``(k // (J W)) J + k % J``
(``J = I // R``, :mod:`staticattn.kernels.dcp.ownership`), and the block table is the rank's local
one. Example (``R = 4``, ``I = 4``, ``W = 2``): the token at position 7 completes entry 1,
held by rank 1 at local index 0; rank 0 gets -1 for it.
"""

from __future__ import annotations

import torch

from staticattn.kernels.compressed.slot_gate import SlotGate
from staticattn.kernels.dcp.ownership import DCPShard, dcp_local_index, dcp_owner
from staticattn.kernels.indexer.indexer_kernel import launch_slots_kernel

__all__ = ["compressed_slot_mapping"]

def compressed_slot_mapping(
    backend: str,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    token_to_req: torch.Tensor,
    block_table: torch.Tensor,
    out: torch.Tensor,
    *,
    num_reqs: int,
    num_tokens: int,
    storage_block_size: int,
    compress_ratio: int,
    dcp: DCPShard | None = None,
    gate: SlotGate | None = None,
) -> None:
    """Write the compressed slot of tokens ``[0, num_tokens)`` into ``out[:num_tokens]``.

    Parameters
    ----------
    query_start_loc, positions, token_to_req : torch.Tensor
    num_reqs, num_tokens : int
        The staged token views and their static extent
        (:mod:`~staticattn.kernels.staging.stage_inputs`, "Token views").
    block_table : int32 device ``(num_reqs, max_blocks)``, unit column stride
    out : int64 device ``(>= num_tokens,)``
        Written on ``[0, num_tokens)`` only.
    storage_block_size : int
        ``S``: compressed entries per block.
    compress_ratio : int
        ``R >= 1``.
    dcp : DCPShard or None
        This rank's shard (``interleave = I // R``): only its entries get a slot, through
        its local ``block_table``. None: no context parallelism.
    gate : SlotGate or None
        V4.1's gate of the slots; None: the position alone decides.

    Graph-safe with either backend: no host read, no data-dependent Python branch.
    """
    if num_tokens == 0:
        return
    if backend == "triton":
        # The indexer's one Triton kernel, in its slots-only mode (the uniform decode build
        # runs both modes in one launch).
        launch_slots_kernel(query_start_loc, positions, token_to_req, block_table, out,
                            num_reqs, num_tokens, storage_block_size, compress_ratio, dcp,
                            gate)
        return
    t = torch.arange(num_tokens, device=out.device)
    real = t < query_start_loc[num_reqs]
    pos = positions[:num_tokens]
    valid = real & (pos >= 0) & ((pos + 1) % compress_ratio == 0)
    if gate is not None:
        valid = valid & gate.allows(pos, torch.where(real, token_to_req[:num_tokens].long(), 0))
    k = torch.where(valid, pos, 0) // compress_ratio
    if dcp is not None and dcp.world > 1:
        valid = valid & (dcp_owner(k, dcp.world, dcp.interleave) == dcp.rank)
        k = dcp_local_index(k, dcp.world, dcp.interleave)
    req = torch.where(valid, token_to_req[:num_tokens].long(), 0)
    block = block_table[req, k // storage_block_size].long()
    slot = block * storage_block_size + k % storage_block_size
    out[:num_tokens].copy_(torch.where(valid, slot, -1))
