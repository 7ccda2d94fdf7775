"""Pieces the prefill consumers share: reading indexer-cache entries into the key rows
DeepGEMM's ``fp8_mqa_logits`` takes and the masked top-k of its logits (both prefill
indexers, :mod:`~staticattn.consumers.real.indexer_prefill`,
:mod:`~staticattn.distributed.pcp_dcp_indexer`), and where each row of a prefill chunk's
gathered keys lives in a paged cache, and which tokens a device-planned chunk holds (the
indexer's prefill and the sparse-MLA prefill,
:mod:`~staticattn.consumers.real.sparse_mla_prefill`, which gather the same chunks from
their own caches). All write into buffers they own or are handed (fixed addresses:
graph-safe).
"""

from __future__ import annotations

import torch

from staticattn.builders.indexer.metadata import IndexerPrefillChunkMetadata, IndexerPrefillPlan
from staticattn.consumers.real.caches import INDEXER_BLOCK
from staticattn.errors import ConfigError

__all__ = ["CacheKeyReader", "ChunkKeyRows", "MaskedTopK"]

#: Scale bytes per key in the cache (one fp32).
SCALE_BYTES = 4


class CacheKeyReader:
    """Reads entries of an indexer K cache (uint8 ``(num_blocks, 64, 1, D + 4)``: per block
    64 rows of ``D`` e4m3 bytes, then 64 fp32 scales) by block and offset.

    The cache is seen as rows of ``D`` bytes -- a block is its 64 value rows, then its scales'
    256 bytes in ``256 / D`` more rows -- and as fp32 words, for the scales; so an entry's
    values are one row and its scale one word, each read with one ``index_select``.
    """

    def __init__(self, kv_cache: torch.Tensor) -> None:
        self.head_dim = kv_cache.shape[-1] - SCALE_BYTES
        if (INDEXER_BLOCK * SCALE_BYTES) % self.head_dim:
            raise ConfigError(f"head_dim={self.head_dim}: a block's scales must fill whole "
                              "rows of the cache's value rows")
        self._rows_per_block = INDEXER_BLOCK + INDEXER_BLOCK * SCALE_BYTES // self.head_dim
        self._words_per_block = self._rows_per_block * self.head_dim // SCALE_BYTES
        self._value_rows = kv_cache.view(-1, self.head_dim)
        self._scale_words = kv_cache.view(torch.float32).view(-1)

    def read(self, block: torch.Tensor, offset: torch.Tensor, values: torch.Tensor,
             scales: torch.Tensor, scratch: torch.Tensor) -> None:
        """``values[i]``, ``scales[i]`` = entry ``offset[i]`` of block ``block[i]``.

        block, offset, scratch : int64 ``(n,)`` (``scratch`` is overwritten);
        values : uint8 ``(n, D)``; scales : fp32 ``(n,)``.
        """
        torch.mul(block, self._rows_per_block, out=scratch)
        scratch.add_(offset)
        torch.index_select(self._value_rows, 0, scratch, out=values)
        torch.mul(block, self._words_per_block, out=scratch)
        scratch.add_(offset).add_(INDEXER_BLOCK * self.head_dim // SCALE_BYTES)
        torch.index_select(self._scale_words, 0, scratch, out=scales)


class MaskedTopK:
    """The top-``K`` columns of logits rows below each row's length, in owned buffers.

    Parameters
    ----------
    rows, width, topk : int
        Capacity in logits rows, logits columns, and ``K`` (the output's width).
    device : torch.device
    """

    def __init__(self, rows: int, width: int, topk: int, device) -> None:
        self.width, self.topk = width, topk
        k = min(topk, width)
        self._cols = torch.arange(width, dtype=torch.int32, device=device).view(1, -1)
        self._mask = torch.empty(rows * width, dtype=torch.bool, device=device)
        self._masked = torch.empty(rows * width, dtype=torch.float32, device=device)
        self._values = torch.empty(rows * k, dtype=torch.float32, device=device)
        self._indices = torch.empty(rows * k, dtype=torch.int64, device=device)
        self._invalid = torch.empty(rows * k, dtype=torch.bool, device=device)
        self._neg_inf = torch.tensor(float("-inf"), dtype=torch.float32, device=device)

    def __call__(self, logits: torch.Tensor, lens: torch.Tensor, out: torch.Tensor,
                 width: int | None = None, values: torch.Tensor | None = None) -> None:
        """``out`` (int32 ``(n, K)``): the columns of the ``K`` largest of the first
        ``width`` (default the capacity's) ``logits`` (fp32 ``(n, >= width)``; columns past
        a row's ``lens`` (int32 ``(n,)``) never chosen), by logit; -1 where a row has fewer
        than ``K`` columns. ``values`` (fp32 ``(n, K)``), given: the chosen columns' logits
        (any value where ``out`` is -1), what a DCP top-k merge ranks them by."""
        n, width = logits.shape[0], self.width if width is None else width
        k = min(self.topk, width)
        lens = lens.view(n, 1)
        mask = self._mask[: n * width].view(n, width)
        masked = self._masked[: n * width].view(n, width)
        torch.lt(self._cols[:, :width], lens, out=mask)
        torch.where(mask, logits[:, :width], self._neg_inf, out=masked)
        best = self._values[: n * k].view(n, k)
        indices = self._indices[: n * k].view(n, k)
        torch.topk(masked, k, dim=1, largest=True, sorted=True, out=(best, indices))
        invalid = self._invalid[: n * k].view(n, k)
        torch.ge(indices, lens, out=invalid)
        out[:, :k].copy_(indices)
        out[:, :k].masked_fill_(invalid, -1)
        if k < out.shape[1]:
            out[:, k:].fill_(-1)
        if values is not None:
            values[:, :k].copy_(best)


class ChunkKeyRows:
    """The cache entries behind the rows of one prefill chunk's gathered keys, and the
    tokens of a device-planned chunk, in owned buffers.

    A chunk's gathered keys are its requests' keys back to back: request ``r``'s key ``j``
    is row ``starts[r] + j`` (``starts`` = the chunk's ``cu_seq_lens``), read from block
    ``block_table[r, j // page]``, entry ``j % page``. A consumer sets the starts
    (:meth:`eager_starts` or :meth:`planned_starts`), asks :meth:`locate` where its rows
    live, and reads them from its own cache.

    Parameters
    ----------
    workspace : int
        Rows of the largest chunk.
    max_reqs, max_tokens : int
        Requests and tokens of the largest step.
    page : int
        Entries per cache block.
    device : torch.device
    """

    def __init__(self, workspace: int, max_reqs: int, max_tokens: int, page: int,
                 device) -> None:
        self.page = page
        w, r, t = workspace, max_reqs, max_tokens
        self._w = torch.arange(w, dtype=torch.int64, device=device)
        self._req, self._key, self._blk, self._at = (
            torch.empty(w, dtype=torch.int64, device=device) for _ in range(4))
        self._blk32 = torch.empty(w, dtype=torch.int32, device=device)
        self._live = torch.empty(w, dtype=torch.bool, device=device)
        self._req_ids = torch.arange(r, dtype=torch.int32, device=device)
        self._in_range, self._chosen = (torch.empty(r, dtype=torch.bool, device=device)
                                        for _ in range(2))
        self._starts = torch.empty(r, dtype=torch.int64, device=device)
        self._tok = torch.arange(t, dtype=torch.int32, device=device)
        self._in_chunk, self._before_end = (torch.empty(t, dtype=torch.bool, device=device)
                                            for _ in range(2))
        self._ks, self._ke = (torch.empty(t, dtype=torch.int32, device=device)
                              for _ in range(2))
        self._no_req = torch.tensor(torch.iinfo(torch.int64).max, dtype=torch.int64,
                                    device=device)
        self._before = torch.tensor(-1, dtype=torch.int64, device=device)
        self._zero = torch.tensor(0, dtype=torch.int32, device=device)

    def eager_starts(self, chunk: IndexerPrefillChunkMetadata, local: bool = False) -> None:
        """The starts of a host-planned chunk's requests: its ``cu_seq_lens[:num_reqs]``
        (``local``: ``local_cu_seq_lens``, where they land in a DCP rank's gathered keys)."""
        r = chunk.num_reqs
        self._starts[:r].copy_((chunk.local_cu_seq_lens if local else chunk.cu_seq_lens)[:r])

    def planned_starts(self, plan: IndexerPrefillPlan, c: int, local: bool = False) -> None:
        """The starts of chunk row ``c`` of a device plan, over all ``R`` requests of the
        plan: a request's plan entry inside the chunk's ``[s, e)``, -1 before (never the
        last <= a row: the first request in range starts at 0), "none" after (above every
        row); ``local``: the entries of a DCP rank's keys (``local_req_key_start``)."""
        key_start = plan.local_req_key_start if local else plan.req_key_start
        r = key_start.shape[0]
        s, e = plan.chunk_bounds[c, 0], plan.chunk_bounds[c, 1]
        reqs, starts = self._req_ids[:r], self._starts[:r]
        at_or_after, chosen = self._in_range[:r], self._chosen[:r]
        torch.ge(reqs, s, out=at_or_after)
        torch.where(at_or_after, self._no_req, self._before, out=starts)
        torch.lt(reqs, e, out=chosen).logical_and_(at_or_after)
        torch.where(chosen, key_start, starts, out=starts)

    def locate(self, num_reqs: int, num_keys: torch.Tensor, block_table: torch.Tensor,
               rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(block, offset, scratch)``, int64 ``(rows,)`` each: where rows ``[0, rows)`` of
        the chunk's gathered keys live; ``scratch`` is free for the caller's reads.

        Row ``w`` is key ``w - starts[r]`` of block-table row ``r``, the last with
        ``starts[r] <= w`` (the starts of the first ``num_reqs`` requests, nondecreasing);
        rows at or past ``num_keys`` (int32 ``(1,)``) read block 0, entry 0 (a row no token
        points at). ``block_table`` : int32 ``(>= num_reqs, max_blocks)``, any strides.
        """
        starts = self._starts[:num_reqs]
        w, req, key = self._w[:rows], self._req[:rows], self._key[:rows]
        blk, live, at = self._blk[:rows], self._live[:rows], self._at[:rows]
        torch.searchsorted(starts, w, right=True, out=req)
        req.sub_(1).clamp_(0, num_reqs - 1)
        torch.lt(w, num_keys, out=live)
        torch.index_select(starts, 0, req, out=key)
        torch.sub(w, key, out=key)
        key.mul_(live)                        # dead rows: key 0 of their request
        # block_table[req, key // page], through the table's own strides (an arena view).
        torch.mul(req, block_table.stride(0), out=at)
        at.add_(torch.div(key, self.page, rounding_mode="floor", out=blk))
        span = (block_table.shape[0] - 1) * block_table.stride(0) + block_table.shape[1]
        torch.index_select(block_table.as_strided((span,), (1,)), 0, at, out=self._blk32[:rows])
        blk.copy_(self._blk32[:rows]).mul_(live)   # dead rows: block 0
        torch.remainder(key, self.page, out=key)
        return blk, key, at

    def planned_tokens(self, plan: IndexerPrefillPlan, c: int,
                       num_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(in_chunk, ks, ke)`` over the step's first ``num_tokens`` tokens for chunk row
        ``c`` of a device plan: bool ``(num_tokens,)``, whether the token is one of the
        chunk's; int32 ``(num_tokens,)`` each, its keys' rows ``[ks, ke)`` in the chunk's
        gathered keys, 0 and 0 outside the chunk."""
        ts, te = plan.chunk_bounds[c, 2], plan.chunk_bounds[c, 3]
        t = num_tokens
        tok, in_chunk, before_end = self._tok[:t], self._in_chunk[:t], self._before_end[:t]
        ks, ke = self._ks[:t], self._ke[:t]
        torch.lt(tok, te, out=before_end)
        torch.ge(tok, ts, out=in_chunk).logical_and_(before_end)
        torch.where(in_chunk, plan.cu_seqlen_ks[:t], self._zero, out=ks)
        torch.where(in_chunk, plan.cu_seqlen_ke[:t], self._zero, out=ke)
        return in_chunk, ks, ke
