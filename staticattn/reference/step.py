"""One step as an engine knows it on the host: the input of every reference function."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import numpy as np

__all__ = ["HostStep"]


@dataclass
class HostStep:
    """One step as an engine knows it on the host.

    query_lens, seq_lens : int32 ``(num_reqs,)`` real requests, decodes first.
    slot_mapping : int64 ``(num_tokens,)``; -1 = do not write.
    block_table : int32 ``(num_reqs, max_blocks_per_req)`` main group.
    swa_block_table : int32 ``(num_reqs, max_swa_blocks_per_req)`` or None.
    num_reqs_padded, num_tokens_padded : extents after graph padding (>= the real ones).
    """

    query_lens: np.ndarray
    seq_lens: np.ndarray
    slot_mapping: np.ndarray
    block_table: np.ndarray
    swa_block_table: np.ndarray | None
    num_reqs_padded: int
    num_tokens_padded: int

    @property
    def num_reqs(self) -> int:
        return int(self.query_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.query_lens.sum())

    @property
    def query_start_loc(self) -> list[int]:
        """Padded query start locations, as plain ints: ``num_reqs_padded + 1`` of them."""
        qsl = [0, *accumulate(int(q) for q in self.query_lens)]
        return qsl + [qsl[-1]] * (self.num_reqs_padded - self.num_reqs)

    def padded_seq_lens(self) -> list[int]:
        """``seq_lens`` as plain ints, 0 for each padded request."""
        return [int(x) for x in self.seq_lens] + [0] * (self.num_reqs_padded - self.num_reqs)
