"""The short-context top-k fill, decided per row on the device (``vllm-0.33-extras.md`` §4).

A token that sees ``n = n_c(p) = (p + 1) // R`` compressed keys needs no scoring when
``n <= K``: its top-k is every key, ``[0, 1, ..., n - 1, -1, ...]`` -- the set the scored
top-k returns too (in score order there, in position order here). The reference decides
the shortcut once per step on the host (``max_seq_len // R <= K``), so a graph replays
whichever branch ran while it was captured (vLLM #52492: captured short, replayed long, a
long row comes back as ``0..K-1``). Here each row decides for itself from its own count,
inside the graph: a row that fits is filled, a row that does not keeps its scored entries.

Example (``R = 4``, ``K = 6``): positions ``[3, 9, 30]`` -> counts ``[1, 2, 7]``; rows 0
and 1 become ``[0, -1, ...]`` and ``[0, 1, -1, ...]``, row 2 (7 keys > 6) keeps its
scored row.
"""

from __future__ import annotations

import torch

from staticattn.kernels.runtime.compiled_launch import launch_rows
from staticattn.kernels.runtime.deferred import lazy_jit

__all__ = ["fill_short_context_topk"]


def fill_short_context_topk(backend: str, topk_indices: torch.Tensor,
                            key_counts: torch.Tensor, *, num_rows: int) -> None:
    """Fill, in place, every row ``t < num_rows`` whose key count fits the top-k.

    Parameters
    ----------
    topk_indices : int32 device ``(>= num_rows, K)``, unit column stride
        The scored rows (request-local key indices, -1 = none); rows that fit are
        overwritten with ``j if j < n else -1``, the others are left as they are.
    key_counts : int32 device ``(>= num_rows,)``
        ``n`` per row: the compressed keys the token sees (0 for a padded token, whose row
        becomes all -1).
    num_rows : int
        Static extent of the rows.

    Graph-safe with either backend: static extents, no host read, no branch on data.
    """
    if num_rows == 0:
        return
    width = topk_indices.shape[1]
    if backend == "triton":
        launch_rows(_kernel(), num_rows, width, topk_indices, topk_indices.stride(0),
                    key_counts, num_rows, width)
        return
    rows = topk_indices[:num_rows]
    n = key_counts[:num_rows].to(rows.dtype)[:, None]
    cols = torch.arange(width, dtype=rows.dtype, device=rows.device)[None, :]
    filled = torch.where(cols < n, cols, -1)
    rows.copy_(torch.where(n <= width, filled, rows))


@lazy_jit()
def _kernel(triton, tl):
    @triton.jit
    def short_context_topk_kernel(topk, topk_stride, key_counts, num_rows, width,
                                  ROWS: tl.constexpr, COLS: tl.constexpr):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        in_rows = rows < num_rows
        n = tl.load(key_counts + rows, mask=in_rows, other=0)
        # Only the rows that fit are stored: the others keep their scored entries.
        fits = in_rows & (n <= width)
        rows64 = rows.to(tl.int64)
        for c0 in range(0, width, COLS):
            cols = c0 + tl.arange(0, COLS)
            cells = fits[:, None] & (cols < width)[None, :]
            value = tl.where(cols[None, :] < n[:, None], cols[None, :], -1)
            tl.store(topk + rows64[:, None] * topk_stride + cols[None, :], value, mask=cells)

    return short_context_topk_kernel
