"""Per-chunk indexer prefill metadata: gathered-K prefix sums and each query token's key
range (spec §4.7).

For a chunk of requests ``[start, end)`` with compressed key counts ``N_r = L_r // R``:

* ``cu_seq_lens = [0, N_0, N_0 + N_1, ...]`` (``end - start + 1`` entries): request ``r``'s keys
  occupy rows ``[cu[r], cu[r+1])`` of the chunk's gathered K;
* for query token ``o`` of request ``r`` (absolute position ``p = L_r - q_r + o``), written at its
  global token index ``query_start_loc[r] + o``: ``ks = cu[r]`` and
  ``ke = cu[r] + (p + 1) // R`` -- the compressed keys complete at or before it.

Example E (``R = 4``): requests ``L = 12, q = 12`` and ``L = 10, q = 3`` -> ``cu = [0, 3, 5]``;
the first request's 12 tokens ``ks = 0``, ``ke = [0,0,0,1,1,1,1,2,2,2,2,3]``; the second's
``ks = 3``, ``ke = [5, 5, 5]``.

Under decode context parallelism (``dcp``) the chunk also gets ``local_cu_seq_lens``, the
prefix sums of this rank's shares of the ``N_r`` (the rows of its locally gathered K), and
``ks`` / ``ke`` become local row bounds: ``ks = local_cu[r]``, ``ke = ks +`` the rank's share
of the ``(p + 1) // R`` keys (:func:`~staticattn.kernels.dcp.ownership.dcp_local_count`).

The key range of a token does not depend on how the chunk's queries are cut into sub-chunks,
so one launch serves every sub-chunk of a request range: each is a slice of the token-indexed
``ks`` / ``ke`` buffers.
"""

from __future__ import annotations

import torch

from staticattn.kernels.dcp.ownership import DCPShard, dcp_local_count, triton_dcp_helpers
from staticattn.kernels.runtime.compiled_launch import launch
from staticattn.kernels.runtime.deferred import lazy_jit

__all__ = ["indexer_prefill_chunk"]


def indexer_prefill_chunk(
    backend: str,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    cu_seqlen_ks: torch.Tensor,
    cu_seqlen_ke: torch.Tensor,
    *,
    start: int,
    end: int,
    token_start: int,
    token_end: int,
    compress_ratio: int,
    dcp: DCPShard | None = None,
    local_cu_seq_lens: torch.Tensor | None = None,
) -> None:
    """Write one chunk's ``cu_seq_lens`` and its tokens' ``ks`` / ``ke``.

    Parameters
    ----------
    query_start_loc : int32 device ``(>= end + 1,)``
    seq_lens : int32 device ``(>= end,)``
        Uncompressed ``L_r``; the device values are the exact ones.
    cu_seq_lens : int32 device ``(end - start + 1,)``
    cu_seqlen_ks, cu_seqlen_ke : int32 device, indexed by global token
        Written on the chunk's tokens ``[token_start, token_end)``.
    start, end : int
        The chunk's requests.
    token_start, token_end : int
        ``query_start_loc[start]`` and ``query_start_loc[end]`` as the host knows them (static
        extent of the launch; the torch version sizes its temporaries with them).
    compress_ratio : int
        ``R >= 1``.
    dcp : DCPShard or None
        This rank's shard of the compressed keys (``interleave = I // R``); None or
        ``world == 1``: no context parallelism.
    local_cu_seq_lens : int32 device ``(end - start + 1,)``
        Under ``dcp``: written with the local key prefix sums.

    Graph-safe with either backend. The Triton version runs one program per request.
    """
    num_reqs = end - start
    sharded = dcp is not None and dcp.world > 1
    world, rank, interleave = dcp if sharded else (1, 0, 1)
    local_cu = local_cu_seq_lens if sharded else cu_seq_lens
    if backend == "triton":
        launch(_chunk_kernel(), (num_reqs,),
            query_start_loc, seq_lens, cu_seq_lens, local_cu, cu_seqlen_ks, cu_seqlen_ke,
            start, compress_ratio, world, rank, interleave, DCP=sharded, BLOCK=256,
        )
        return
    keys = seq_lens[start:end].clamp(min=0) // compress_ratio
    cu_seq_lens[:1].zero_()
    torch.cumsum(keys, 0, dtype=torch.int32, out=cu_seq_lens[1 : num_reqs + 1])
    if sharded:
        local_cu[:1].zero_()
        torch.cumsum(dcp_local_count(keys, world, rank, interleave), 0, dtype=torch.int32,
                     out=local_cu[1 : num_reqs + 1])
    t = torch.arange(token_start, token_end, device=seq_lens.device, dtype=torch.int32)
    req = torch.searchsorted(query_start_loc[start + 1 : end + 1], t, right=True)
    first = query_start_loc[start + req]
    pos = seq_lens[start + req] - (query_start_loc[start + req + 1] - first) + (t - first)
    ks = local_cu[req]
    visible = (pos + 1).clamp(min=0) // compress_ratio
    cu_seqlen_ks[token_start:token_end].copy_(ks)
    cu_seqlen_ke[token_start:token_end].copy_(
        ks + dcp_local_count(visible, world, rank, interleave))


@lazy_jit(triton_dcp_helpers)
def _chunk_kernel(triton, tl, dcp_local_count_tl, **_):
    @triton.jit
    def chunk_kernel(
        qsl, seq_lens, cu_seq_lens, local_cu_seq_lens, ks_out, ke_out, start, compress_ratio,
        dcp_world, dcp_rank, dcp_interleave, DCP: tl.constexpr, BLOCK: tl.constexpr,
    ):
        r = tl.program_id(0)
        b = start + r
        # cu[r]: the compressed keys of the chunk's requests before this one (and, under
        # DCP, local_cu[r]: this rank's share of them).
        acc = tl.zeros([BLOCK], dtype=tl.int32)
        local_acc = tl.zeros([BLOCK], dtype=tl.int32)
        for c in range(start, b, BLOCK):
            idx = c + tl.arange(0, BLOCK)
            keys = tl.maximum(tl.load(seq_lens + idx, mask=idx < b, other=0), 0) // compress_ratio
            acc += keys
            if DCP:
                local_acc += dcp_local_count_tl(keys, dcp_world, dcp_rank, dcp_interleave)
        cu = tl.sum(acc, axis=0)
        seq_len = tl.load(seq_lens + b)
        first = tl.load(qsl + b)
        query_len = tl.load(qsl + b + 1) - first
        own_keys = tl.maximum(seq_len, 0) // compress_ratio
        tl.store(cu_seq_lens + r + 1, cu + own_keys)
        tl.store(cu_seq_lens + r, cu, mask=r == 0)
        if DCP:
            cu = tl.sum(local_acc, axis=0)
            tl.store(local_cu_seq_lens + r + 1,
                     cu + dcp_local_count_tl(own_keys, dcp_world, dcp_rank, dcp_interleave))
            tl.store(local_cu_seq_lens + r, cu, mask=r == 0)
        context = seq_len - query_len
        for o in range(0, query_len, BLOCK):
            offs = o + tl.arange(0, BLOCK)
            mask = offs < query_len
            visible = tl.maximum(context + offs + 1, 0) // compress_ratio
            if DCP:
                visible = dcp_local_count_tl(visible, dcp_world, dcp_rank, dcp_interleave)
            tl.store(ks_out + first + offs, tl.zeros([BLOCK], dtype=tl.int32) + cu, mask=mask)
            tl.store(ke_out + first + offs, cu + visible, mask=mask)

    return chunk_kernel
