"""What every emulated PCP rank step does around its attention
(``prefill-context-parallel.md`` §3.3, §2.3): the rank's local tokens' new keys
**all-gathered** and written at the gathered slot mapping, so that every cache holds the
step's keys; and the rank's output rows **all-gathered** and **restored** to global token
order with ``hidden_restore_idx``. Both collectives run on fixed-size buffers (every rank
pads to ``N`` tokens), inside the rank's graph.
"""

from __future__ import annotations

import torch

from staticattn.builders.batch import Batch
from staticattn.builders.pcp.rank_views import PCPViews
from staticattn.consumers.dcp.merge import gather_rank_major
from staticattn.distributed.step_keys import new_keys, write_keys

__all__ = ["RankExchange"]


class RankExchange:
    """The keys in and the rows out of one PCP rank's step.

    Parameters
    ----------
    views : PCPViews
        The rank's PCP views (states, gathered slots, restore index, the staged batch).
    rank, world : int
        PCP rank and size.
    group : ProcessGroup or None
        The PCP group (None: the default group).
    columns : int
        Columns of an output row.
    device : torch.device

    Attributes
    ----------
    keys : int32 ``(P, N)``
        Every rank's local tokens' new keys after :meth:`share_keys` (rank-major).
    rows : int64 ``(P, N, columns)``
        The rank's step writes its own rows (:attr:`mine`); :meth:`restore` gathers them.
    out : int64 ``(T, columns)``
        The restored rows of the last step (rows past the step's tokens 0).
    """

    def __init__(self, views: PCPViews, rank: int, world: int, group, columns: int,
                 device: torch.device) -> None:
        self.views, self.rank, self.world, self.group = views, rank, world, group
        N = views.rows.token_to_global.shape[1]
        T = views.rows.hidden_restore_idx.numel()
        self.keys = torch.zeros(world, N, dtype=torch.int32, device=device)
        self.rows = torch.zeros(world, N, columns, dtype=torch.int64, device=device)
        self.out = torch.zeros(T, columns, dtype=torch.int64, device=device)
        self._token = torch.arange(T, device=device)

    @property
    def mine(self) -> torch.Tensor:
        """This rank's output rows, int64 ``(N, columns)``."""
        return self.rows[self.rank]

    def share_keys(self, batch: Batch, cache: torch.Tensor) -> None:
        """Compute the rank's ``N`` new keys (each token's request state and position),
        all-gather them and write every rank's at the gathered slots of ``cache`` (int32
        ``(entries,)``, by slot)."""
        N = self.keys.shape[1]
        states = self.views.fields.req_idx.index_select(0, batch.token_to_req[:N].long())
        new_keys(states, batch.positions[:N], self.keys[self.rank])
        self.gather_keys()
        write_keys(cache, self.views.gathered_slots, self.keys.view(-1))

    def gather_keys(self) -> None:
        """The keys' all-gather alone (the bench times the collectives)."""
        gather_rank_major(self.keys, self.world, self.rank, self.group)

    def gather_rows(self) -> None:
        """The rows' all-gather alone."""
        gather_rank_major(self.rows, self.world, self.rank, self.group)

    def restore(self) -> torch.Tensor:
        """All-gather the rows and put them in global token order: :attr:`out`, int64
        ``(T, columns)``."""
        self.gather_rows()
        restore = self.views.rows.hidden_restore_idx.long()
        flat = self.rows.view(-1, self.rows.shape[-1])
        tokens = self.views.staged("query_start_loc")[-1]
        self.out.copy_(torch.where((self._token < tokens)[:, None],
                                   flat.index_select(0, restore), 0))
        return self.out
