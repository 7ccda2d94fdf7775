"""Two pieces the prefill indexers share (:mod:`~staticattn.consumers.real.indexer_prefill`,
:mod:`~staticattn.distributed.pcp_dcp_indexer`): reading indexer-cache entries into the key
rows DeepGEMM's ``fp8_mqa_logits`` takes, and the masked top-k of its logits. Both write
into buffers they own or are handed (fixed addresses: graph-safe).
"""

from __future__ import annotations

import torch

from staticattn.consumers.real.caches import INDEXER_BLOCK
from staticattn.errors import ConfigError

__all__ = ["CacheKeyReader", "MaskedTopK"]

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
                 width: int | None = None) -> None:
        """``out`` (int32 ``(n, K)``): the columns of the ``K`` largest of the first
        ``width`` (default the capacity's) ``logits`` (fp32 ``(n, >= width)``; columns past
        a row's ``lens`` (int32 ``(n,)``) never chosen), by logit; -1 where a row has fewer
        than ``K`` columns."""
        n, width = logits.shape[0], self.width if width is None else width
        k = min(self.topk, width)
        lens = lens.view(n, 1)
        mask = self._mask[: n * width].view(n, width)
        masked = self._masked[: n * width].view(n, width)
        torch.lt(self._cols[:, :width], lens, out=mask)
        torch.where(mask, logits[:, :width], self._neg_inf, out=masked)
        values = self._values[: n * k].view(n, k)
        indices = self._indices[: n * k].view(n, k)
        torch.topk(masked, k, dim=1, largest=True, sorted=True, out=(values, indices))
        invalid = self._invalid[: n * k].view(n, k)
        torch.ge(indices, lens, out=invalid)
        out[:, :k].copy_(indices)
        out[:, :k].masked_fill_(invalid, -1)
        if k < out.shape[1]:
            out[:, k:].fill_(-1)
