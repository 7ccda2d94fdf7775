"""How the indexer lays out a step's decodes, from what the host knows of it.

* :class:`DecodeLayout`: ``rows x width`` per-token lengths (native: a row per request and
  a column per query token; flatten: a row per token) and whether the consumer must pack
  the queries;
* :class:`DecodeLens`: whether the decode query lengths are all equal and the longest, the
  host facts a consumer writing the indexer K reads (``decode_is_uniform``,
  ``write_max_decode_len``);
* the batch's host query starts and the staged views every indexer build needs.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from staticattn.arena import ArenaConfig
from staticattn.builders.batch import Batch
from staticattn.errors import InvalidBatchError

__all__ = ["DecodeLayout", "DecodeLens", "eager_layout", "flattens", "need_token_views"]


def flattens(config: ArenaConfig) -> bool:
    """Whether uniform MTP decodes are flattened into single-token rows (``next_n >= 3`` on
    Hopper by default)."""
    return bool(config.use_flattening) and config.next_n > 1


class DecodeLayout(NamedTuple):
    """``rows x width`` lengths; flatten adds the expanded block table."""

    flatten: bool
    rows: int
    width: int
    requires_padding: bool


class DecodeLens(NamedTuple):
    """What the host knows of a step's decode query lengths: whether they are all equal,
    and the longest (or its bound, for a graph-safe build)."""

    uniform: bool
    longest: int

    @classmethod
    def of(cls, query_lens) -> DecodeLens:
        """From the decode requests' host query lengths (non-empty)."""
        longest = int(query_lens.max())
        return cls(int(query_lens.min()) == longest, longest)


def eager_layout(config: ArenaConfig, query_lens: np.ndarray, num_decodes: int,
                 num_decode_tokens: int) -> DecodeLayout:
    """The layout of an eager build's decodes from the host query lengths
    (``query_lens``: host ints ``(num_reqs,)``, decodes first)."""
    decode_lens = query_lens[:num_decodes]
    longest, shortest = int(decode_lens.max()), int(decode_lens.min())
    if config.use_flattening and longest > 1:
        return DecodeLayout(True, num_decode_tokens, 1, False)
    return DecodeLayout(False, num_decodes, max(longest, 1), shortest != longest)


def need_token_views(batch: Batch) -> None:
    """Typed error unless the batch carries the staged positions and token_to_req views."""
    if batch.positions is None or batch.token_to_req is None:
        raise InvalidBatchError(
            "the indexer reads the staged positions and token_to_req views; build the batch "
            "with Batch.from_inputs / Batch.from_staged"
        )
