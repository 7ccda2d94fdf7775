"""Block ids against the KV pool, where the host can see them without reading the device.

The block tables are arena views the engine updates in place, the rows that changed. On a
CUDA arena they live on the device, and reading them on every step would synchronise with
it; so the ids are checked where they cross from the host:

* :meth:`BlockIds.write` writes ids into a table row after checking them (one vectorized
  pass over the ids written): the way to have them checked on any device, at no cost to the
  steps that follow;
* :meth:`BlockIds.check_step`, on every step the graph manager validates, checks the rows
  the step uses in the columns its sequences reach -- only where the tables are host memory
  (a CPU arena), where the check reads no device. On a CUDA arena it does nothing: rows
  written straight into the device views are the engine's to vouch for.

A block id is valid in ``[0, num_kv_blocks)`` (0 is the null block).
"""

from __future__ import annotations

import numpy as np
import torch

from staticattn.arena.config import cdiv
from staticattn.arena.groups import cache_groups
from staticattn.errors import InvalidBatchError
from staticattn.validation.values import check_block_ids, tokens_per_block

__all__ = ["BlockIds"]


class BlockIds:
    """The block tables of one arena's inputs, checked against a KV pool of ``num_kv_blocks``
    blocks (see the module docstring).

    Parameters
    ----------
    inputs : StepInputs
        The arena's inputs; their tables are ``block_table`` (the main cache group, a column
        per ``block_size * dcp_world_size`` tokens), with SWA ``swa_block_table`` (a column
        per ``swa_block_size`` tokens), and ``block_tables[group]`` of each cache group with
        a table of its own (a column per
        :attr:`~staticattn.arena.CacheGroup.tokens_per_column` tokens).
    num_kv_blocks : int
        Blocks of the KV pool.
    """

    def __init__(self, inputs, num_kv_blocks: int) -> None:
        cfg = inputs.config
        self.num_kv_blocks = num_kv_blocks
        self.tables: dict[str, tuple[torch.Tensor, int]] = {
            "block_table": (inputs.block_table, tokens_per_block(cfg, swa=False))}
        if inputs.swa_block_table is not None:
            self.tables["swa_block_table"] = (inputs.swa_block_table,
                                              tokens_per_block(cfg, swa=True))
        for group in cache_groups(cfg):
            self.tables[group.name] = (inputs.block_tables[group.name],
                                       group.tokens_per_column)
        #: The tables the host reads for free, as numpy views: every table of a CPU arena.
        self.host_tables = [(name, t.numpy(), per_block) for name, (t, per_block)
                            in self.tables.items() if t.device.type == "cpu"]

    def check_step(self, num_reqs: int, seq_lens: np.ndarray) -> None:
        """The ids in the columns each of the first ``num_reqs`` rows uses (``cdiv(L_b,
        tokens per column)``), in every host-resident table; a typed error naming the first
        invalid one. Host ints ``seq_lens`` ``(num_reqs,)``, already checked
        (``0 <= L_b <= max_model_len``)."""
        if not self.host_tables or not num_reqs:
            return
        longest = seq_lens.item(seq_lens.argmax())
        for name, table, per_block in self.host_tables:
            # One pass over the rectangle the longest row reaches, unsigned: a negative id
            # is past every pool. Exact only when every id in it is valid; columns past a
            # shorter row's end may hold anything, so a hit is confirmed per row.
            used = table[:num_reqs, : cdiv(longest, per_block)].view(np.uint32)
            if used.size and used.max() >= self.num_kv_blocks:
                check_block_ids(name, table[:num_reqs], seq_lens.astype(np.int64), per_block,
                                self.num_kv_blocks)

    def write(self, table: str, row: int, block_ids, start: int = 0) -> None:
        """Write ``block_ids`` (host ints ``(n,)``) into ``table`` (``"block_table"``,
        ``"swa_block_table"`` or a cache group's name, ``"c2a.index_k"``) at
        ``[row, start : start + n]``, after checking the row, the columns and every id; a
        typed error before anything is written otherwise.

        One copy to the device per call: write a row's new blocks together. Waits for
        nothing: like any in-place update of a table, do it between steps, never while a
        step that reads the row may still run."""
        if table not in self.tables:
            raise InvalidBatchError(f"no block table {table!r}; this arena has "
                                    f"{sorted(self.tables)}")
        view, _ = self.tables[table]
        ids = np.asarray(block_ids)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise InvalidBatchError(f"block ids must be 1-D integers; got shape {ids.shape}, "
                                    f"dtype {ids.dtype}")
        rows, columns = view.shape
        if isinstance(row, bool) or not isinstance(row, (int, np.integer)) or not (
                0 <= row < rows):
            raise InvalidBatchError(f"row {row!r} is outside {table}'s rows [0, {rows})")
        if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or not (
                0 <= start and start + ids.size <= columns):
            raise InvalidBatchError(f"columns [{start!r}, {start!r} + {ids.size}) are outside "
                                    f"{table}'s columns [0, {columns})")
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_kv_blocks):
            c = int(np.argmax((ids < 0) | (ids >= self.num_kv_blocks)))
            raise InvalidBatchError(
                f"{table}[{row}, {start + c}]={int(ids[c])} is out of range [0, "
                f"{self.num_kv_blocks}) (num_kv_blocks: the KV pool's blocks)")
        view[row, start : start + ids.size].copy_(
            torch.from_numpy(ids.astype(np.int32, copy=False)))
