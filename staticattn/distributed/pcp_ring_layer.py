"""The emulated ratio-2 compressor of DeepSeek V4.1 under prefill context parallelism, and
its single-GPU twin (``prefill-context-parallel.md`` §4.2): what a compressor layer does
with the ring links (:mod:`staticattn.builders.pcp.ring_link`), reduced to its data
movement.

A token at an odd position completes a 2-token group; its compressed value here is
:func:`group_value` ``(first half, own key)`` (a token at an even position completes none:
:data:`NO_GROUP`). The first half is the key of the token before it:

* inside the same row (single GPU: the same request's step tokens), the previous token's;
* at the start of a row that straddles a group with another rank's chunk, the last key of
  the row ``prev_row_indices[row]`` names, from ``prev_rows`` (every rank's rows' last keys,
  all-gathered at a fixed ``P * R``: vLLM's ``all_gather_PCP(kv_score[gather_tokens])``);
* at the start of the request's step tokens (a row at query offset 0), the compressor
  ring's saved row of the previous step's open group, ``ring_block * Cap + (pos - 1) % Cap``.

After the groups are read, every rank saves ``prev_rows[k]`` at ``ring_write_slots[k]``
(the newest row of each request ending at an even position: an open group), so every
rank's ring stays equal; the single-GPU twin saves each request's last key where its last
position is even, and its ring must equal every rank's after every step. Worked example 4
(P = 4, q = (37, 100), ring blocks A -> 5, B -> 9): A's token 35 opens rank 0's row
A[35, 37) and takes key 34 from gathered row 9 (rank 1's A[30, 35)); every rank saves A's
key 36 at ring slot ``5 * 8 + 36 % 8 = 44``, which A's next step, starting at 37, reads.
A wrong link, a wrong ring slot or a row saved on the wrong rank changes a restored column
or a later step's ring read.

The ring (ring blocks x ``Cap`` keys) lives across steps; everything is fixed-size and
read on the device only, so it runs inside the rank's graph.
"""

from __future__ import annotations

import torch

from staticattn.arena import ArenaConfig
from staticattn.builders.batch import Batch
from staticattn.builders.compressed import ring_capacity
from staticattn.builders.pcp.rank_step import input_table
from staticattn.builders.pcp.rank_views import PCPViews
from staticattn.builders.pcp.ring_link import ring_table
from staticattn.consumers.dcp.merge import gather_rank_major
from staticattn.distributed.step_keys import KEY_BITS, write_keys

__all__ = ["COMPRESSOR_COLUMN", "NO_GROUP", "PCPRingCompressor", "SingleRingCompressor",
           "group_value"]

#: The name of the output column the compressed values go to.
COMPRESSOR_COLUMN = "compressor"
#: The compressed value of a token that completes no group (an even position).
NO_GROUP = -1


def group_value(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """The compressed value of 2-token groups, int64 ``(n,)``, from the keys (int32
    ``(n,)``) of their first and second tokens: both keys side by side
    (``first << 20 | second``), so a wrong, missing or swapped half shows."""
    return (first.long() << KEY_BITS) | second.long()


def _compress(keys: torch.Tensor, positions: torch.Tensor, starts: torch.Tensor,
              start_half: torch.Tensor, out: torch.Tensor) -> None:
    """``out[j]`` (int64 ``(n,)``): the group value of token ``j`` at an odd position, else
    :data:`NO_GROUP`; its first half is ``start_half[j]`` where ``starts[j]`` (the token
    opens a row), else the key before it. ``keys``, ``start_half`` int32 ``(n,)``,
    ``positions`` int ``(n,)``, ``starts`` bool ``(n,)``."""
    first = torch.where(starts, start_half, torch.roll(keys, 1))
    out.copy_(torch.where(positions % 2 == 1, group_value(first, keys), NO_GROUP))


def _ring_reads(ring: torch.Tensor, ring_block: torch.Tensor, positions: torch.Tensor,
                capacity: int) -> torch.Tensor:
    """The ring's row of the group each token at ``positions`` would close, int32 ``(n,)``:
    ``ring[ring_block * Cap + (pos - 1) % Cap]`` (int ``ring_block``, ``positions``
    ``(n,)``)."""
    return ring.index_select(0, ring_block.long() * capacity
                             + (positions.long() - 1) % capacity)


class PCPRingCompressor:
    """The compressor of one PCP rank: ``(batch, keys, out)`` writes its local tokens'
    compressed values and saves the step's open groups in the ring (see the module).

    Parameters
    ----------
    views : PCPViews
        The rank's PCP views, with the ring links (``views.ring``).
    rank, world : int
        PCP rank and size.
    group : ProcessGroup or None
        The PCP group (None: the default group).
    num_ring_blocks : int
        Blocks of the ring; every ring block of a batch (column 0 of the ring's table) must
        be below it.

    Attributes
    ----------
    ring_keys : int32 ``(num_ring_blocks * Cap,)``
        The saved rows, zeros before the first step; equal on every rank after each step.
    prev_rows : int32 ``(P, R)``
        Every rank's rows' last keys of the last step (gathered row ``rank * R + row``).
    """

    def __init__(self, views: PCPViews, rank: int, world: int, group,
                 num_ring_blocks: int) -> None:
        if views.ring is None:
            raise ValueError("a PCP compressor needs the ring links (views.ring): only a "
                             "model with a ratio-2 compressor ring (DeepSeek V4.1) has them")
        self.views, self.rank, self.world, self.group = views, rank, world, group
        links = views.ring
        dev = links.prev_row_indices.device
        self.ring_keys = torch.zeros(num_ring_blocks * links.capacity, dtype=torch.int32,
                                     device=dev)
        self.prev_rows = torch.zeros(links.prev_row_indices.shape, dtype=torch.int32,
                                     device=dev)
        self._token = torch.arange(views.rows.token_to_global.shape[1], device=dev)

    def exchange(self) -> None:
        """The compressor's collective alone (the bench times it): the rows' last keys."""
        gather_rank_major(self.prev_rows, self.world, self.rank, self.group)

    def __call__(self, batch: Batch, keys: torch.Tensor, out: torch.Tensor) -> None:
        """Compress the rank's ``N`` local tokens of ``batch`` (its rows as the builders
        read them), whose keys are int32 ``keys`` ``(N,)``, into int64 ``out`` ``(N,)``
        (any stride); then save the open groups."""
        links, rows = self.views.ring, self.views.rows
        N, R = keys.shape[0], self.prev_rows.shape[1]
        qsl = batch.query_start_loc[:R + 1].long()
        # gather_tokens: each row's last local token (an empty row's is never linked to
        # and never saved).
        self.prev_rows[self.rank].copy_(keys.index_select(0, (qsl[1:] - 1).clamp(min=0)))
        gather_rank_major(self.prev_rows, self.world, self.rank, self.group)
        row = batch.token_to_req[:N].long()
        req = rows.row_req[self.rank].long().index_select(0, row)
        block = self.views.tables[links.table][:, 0].index_select(0, req)
        link = links.prev_row_indices[self.rank].long().index_select(0, row)
        linked = torch.where(link >= 0,
                             self.prev_rows.view(-1).index_select(0, link.clamp(min=0)), 0)
        ring = _ring_reads(self.ring_keys, block, batch.positions[:N], links.capacity)
        # A row at query offset 0 opens the request's step tokens: its group's first half,
        # if any, was saved by an earlier step; any other row's is another row's last key.
        offset = rows.row_offset[self.rank].index_select(0, row)
        starts = self._token[:N] == qsl.index_select(0, row)
        _compress(keys, batch.positions[:N], starts, torch.where(offset == 0, ring, linked),
                  out)
        write_keys(self.ring_keys, links.ring_write_slots, self.prev_rows.view(-1))


class SingleRingCompressor:
    """The single-GPU twin of :class:`PCPRingCompressor`: ``(batch, keys, out)`` over the
    global batch, each request's step tokens one row.

    Parameters
    ----------
    config : ArenaConfig
        The one-rank arena's config: a model with a ratio-2 compressor ring.
    num_ring_blocks : int
        As the ranks'.

    Attributes
    ----------
    ring_keys : int32 ``(num_ring_blocks * Cap,)``
        As a rank's; equal to every rank's after each step.
    """

    def __init__(self, config: ArenaConfig, num_ring_blocks: int) -> None:
        table = ring_table(config)
        if table is None:
            raise ValueError(f"{config.architecture} has no ratio-2 compressor ring")
        self.table = table
        self.capacity = ring_capacity(config.num_speculative_tokens)
        dev = config.torch_device
        self.ring_keys = torch.zeros(num_ring_blocks * self.capacity, dtype=torch.int32,
                                     device=dev)
        self._token = torch.arange(config.max_num_batched_tokens, device=dev)

    def __call__(self, batch: Batch, keys: torch.Tensor, out: torch.Tensor) -> None:
        """Compress the ``n`` tokens of ``batch``, keys int32 ``(n,)``, into int64 ``out``
        ``(n,)``; then save each request's last key where its last position is even."""
        n, S = keys.shape[0], batch.num_reqs
        qsl, positions = batch.query_start_loc[:S + 1].long(), batch.positions[:n]
        block = input_table(batch, self.table)[:S, 0]
        req = batch.token_to_req[:n].long()
        ring = _ring_reads(self.ring_keys, block.index_select(0, req), positions, self.capacity)
        _compress(keys, positions, self._token[:n] == qsl.index_select(0, req), ring, out)
        last = (qsl[1:] - 1).clamp(min=0)
        last_pos = positions.long().index_select(0, last)
        open_group = (qsl[1:] > qsl[:-1]) & (last_pos % 2 == 0)
        slots = torch.where(open_group, block.long() * self.capacity
                            + last_pos % self.capacity, -1)
        write_keys(self.ring_keys, slots, keys.index_select(0, last))
