"""The dense type's prefill rows of a step, chunk by chunk, in a fixed workspace.

A prefill token's C128A row is the local indices ``0 .. n_c - 1`` of its ``n_c = min((p + 1)
// 128, maxC)`` complete compressed entries, then -1 (``vllm-0.33-extras.md`` §5.2). One such
row per prefill token of a step is ``T x maxC`` int32 (256 MiB at a 1M context and 8,192
tokens), and a reader needs the rows of one chunk of tokens at a time. So the step's
metadata carries :class:`DensePrefillChunks`: a workspace of ``Rc =``
:func:`~staticattn.builders.swa.declarations.dense_prefill_chunk_rows` rows
(``dense_prefill_workspace_bytes``) and the step's static extents, and the reader writes
chunk ``c`` -- the rows of prefill rows ``[c Rc, (c + 1) Rc)`` -- right before it reads
it, inside the same step and the same graph::

    chunks = md.dense_prefill
    for c in range(chunks.num_chunks):
        indices, lens = chunks.write(c)   # (rows, maxC), (rows,) int32 views
        first = chunks.first_row(c)       # workspace row i = prefill row first + i

Each write overwrites the previous chunk. The number of chunks is static (the prefill
extent over ``Rc``: from a mixed build the bucket's tokens, whatever the composition) and
the device decides their contents: a chunk past the step's real prefill tokens holds rows
of -1 and length 0 and costs one small launch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from staticattn.arena.config import cdiv
from staticattn.errors import ArenaError, InvalidBatchError
from staticattn.kernels.swa.dense_prefill_rows import build_dense_prefill_chunk

__all__ = ["DensePrefillChunks"]


@dataclass(frozen=True, slots=True, eq=False)
class DensePrefillChunks:
    """The dense type's prefill rows of one step, written a chunk at a time.

    Attributes
    ----------
    backend : {"torch", "triton"}
    indices : int32 device ``(Rc, maxC)``;  lens : int32 device ``(Rc,)``
        The workspace (``swa.dense_prefill_indices``, ``swa.dense_prefill_lens``).
    positions : int64 device ``(>= num_tokens,)``
        The batch's token positions.
    ratio : int
        ``R`` of the dense type (128 for C128A).
    num_prefill_tokens : int
        Static extent of the prefill rows: the step's ``Tp`` from an eager build, the
        bucket's tokens from a mixed build (an upper bound of the real ``Tp``).
    num_decode_tokens, num_tokens : int
        ``Td`` and ``nt`` of an eager build; ignored with ``step_counts``.
    step_counts : int32 device ``(4,)`` or None
        A mixed build's staging counts: ``Td`` and ``nt`` decided on the device.
    """

    backend: str
    indices: torch.Tensor
    lens: torch.Tensor
    positions: torch.Tensor
    ratio: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_tokens: int
    step_counts: torch.Tensor | None = None

    def __post_init__(self) -> None:
        rows, width = self.indices.shape
        # The kernels address rows by their width, and row i's length at lens[i].
        if self.indices.stride(0) != width or self.lens.shape != (rows,):
            raise ArenaError(
                f"the dense prefill workspace must be contiguous rows (Rc, maxC) with "
                f"lengths (Rc,), got {tuple(self.indices.shape)} of row stride "
                f"{self.indices.stride(0)} and lengths {tuple(self.lens.shape)}; pass the "
                "arena views"
            )

    @property
    def rows_per_chunk(self) -> int:
        """``Rc``: prefill rows one chunk holds."""
        return self.indices.shape[0]

    @property
    def num_chunks(self) -> int:
        """``cdiv(num_prefill_tokens, Rc)``: static, the same for every step of a graph."""
        return cdiv(self.num_prefill_tokens, self.rows_per_chunk)

    def first_row(self, chunk: int) -> int:
        """The prefill row held by workspace row 0 of ``chunk`` (one :meth:`write` took):
        ``chunk * Rc`` (the token ``Td + chunk * Rc``)."""
        return chunk * self.rows_per_chunk

    def write(self, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``chunk`` into the workspace and return its rows.

        Returns
        -------
        (indices, lens) : int32 ``(rows, maxC)``, ``(rows,)``
            Views of the workspace, ``rows = min(Rc, num_prefill_tokens - first_row)``:
            row ``i`` is prefill row ``first_row(chunk) + i``, the same row and length as a
            buffer of one row per prefill token would hold; -1 and 0 past the real prefill
            tokens. Valid until the next write.

        Raises
        ------
        InvalidBatchError
            ``chunk`` is not an int in ``[0, num_chunks)``; nothing is written.
        """
        if (not isinstance(chunk, int) or isinstance(chunk, bool)
                or not 0 <= chunk < self.num_chunks):
            raise InvalidBatchError(
                f"chunk={chunk!r} is not a chunk of this step: the dense prefill rows have "
                f"{self.num_chunks} chunks of {self.rows_per_chunk} rows "
                f"({self.num_prefill_tokens} prefill rows); iterate range(num_chunks)"
            )
        first = self.first_row(chunk)
        rows = min(self.rows_per_chunk, self.num_prefill_tokens - first)
        build_dense_prefill_chunk(self.backend, self.indices, self.lens, self.positions,
                                  self.ratio, first, rows, self.num_tokens,
                                  self.num_decode_tokens, self.step_counts)
        return self.indices[:rows], self.lens[:rows]
