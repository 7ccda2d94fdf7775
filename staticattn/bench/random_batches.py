"""Randomized steps for sanity checks, the demo and benchmarks.

Each function writes the block-table rows of the requests it draws into the arena (as an
engine would, in place) and returns the host arrays a step is run with.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from staticattn.arena import ArenaConfig, cache_groups, cdiv
from staticattn.staging import PAD_SLOT_ID, StepInputs
from staticattn.validation.values import tokens_per_block

__all__ = [
    "NUM_KV_BLOCKS", "RandomStep", "block_ids", "fixed_step", "random_mixed_step",
    "random_uniform_decode", "write_block_rows",
]

#: The KV pool (blocks) random steps address by default: their block ids are in ``[1, it)``.
NUM_KV_BLOCKS = 4096


@dataclass(slots=True)
class RandomStep:
    """Host arrays of one step (decodes first)."""

    query_lens: np.ndarray  # int32 (num_reqs,)
    seq_lens: np.ndarray  # int32 (num_reqs,)
    slot_mapping: np.ndarray  # int64 (num_tokens,)


def write_block_rows(
    inputs: StepInputs, seq_lens: np.ndarray, rng: np.random.Generator, num_kv_blocks: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """Fill the block-table columns the requests need with random block ids in
    ``[1, num_kv_blocks)`` (0 is the null block); returns the host rows written.

    Only the first ``cdiv(max(seq_lens), block_size)`` columns are written, as an engine
    writes only the blocks a request owns; lengths bound every read. The tables of the
    config's cache groups (DeepSeek V4.1: ``inputs.block_tables``) get the columns
    ``max(seq_lens)`` tokens need, a ring its one block. ``seq_lens``: host ints
    ``(num_reqs,)``; returns ``(main, swa)``: the int32 ``(num_reqs, columns)`` host rows of
    each table (``swa`` None without SWA layers)."""
    r = seq_lens.shape[0]
    return _write_rows(inputs, r, int(seq_lens.max()) if r else 0, rng, num_kv_blocks)


def _write_rows(inputs: StepInputs, r: int, longest: int, rng: np.random.Generator,
                num_kv_blocks: int) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`write_block_rows` for ``r`` rows of sequences up to ``longest`` tokens."""
    cfg = inputs.config
    main = _random_rows(inputs.block_table, r, cdiv(longest, tokens_per_block(cfg, swa=False)),
                        rng, num_kv_blocks)
    swa = None
    if inputs.swa_block_table is not None:
        swa = _random_rows(inputs.swa_block_table, r,
                           cdiv(longest, tokens_per_block(cfg, swa=True)), rng, num_kv_blocks)
    for group in cache_groups(cfg):
        _random_rows(inputs.block_tables[group.name], r, group_columns(group, longest),
                     rng, num_kv_blocks)
    return main, swa


def group_columns(group, tokens: int) -> int:
    """Columns of a cache group's table that ``tokens`` tokens use: one for a ring, else
    ``cdiv(tokens, tokens_per_column)`` (``R * S`` tokens a column, times the DCP ranks for a
    sharded cache: :class:`~staticattn.arena.CacheGroup`)."""
    if group.columns == 1:
        return 1
    return cdiv(tokens, group.tokens_per_column)


def block_ids(rng: np.random.Generator, num_kv_blocks: int, size) -> np.ndarray:
    """Random block ids of a pool of ``num_kv_blocks`` blocks: int32 of shape ``size`` (e.g.
    ``(rows, columns)``) in ``[1, num_kv_blocks)``, 0 (the null block) being left out; all 0
    for a pool of one block, which holds nothing else."""
    return rng.integers(1 if num_kv_blocks > 1 else 0, num_kv_blocks, size=size,
                        dtype=np.int32)


def _random_rows(table: torch.Tensor, rows: int, cols: int, rng: np.random.Generator,
                 num_kv_blocks: int) -> np.ndarray:
    host = block_ids(rng, num_kv_blocks, (rows, max(cols, 1)))
    table[:rows, : host.shape[1]].copy_(torch.from_numpy(host))
    return host


def _slots(cfg: ArenaConfig, main: np.ndarray, swa: np.ndarray | None, q: np.ndarray,
           s: np.ndarray, rng: np.random.Generator, invalid_fraction: float) -> np.ndarray:
    """``rows[b, p // bs] * bs + p % bs`` for every token ``p`` of every request ``b``, through
    the SWA rows where there are some, else the main rows."""
    rows, block_size = (swa, cfg.swa_block_size) if swa is not None else (main, cfg.block_size)
    q64 = q.astype(np.int64)
    starts = np.concatenate(([0], np.cumsum(q64)[:-1]))
    req = np.repeat(np.arange(q.shape[0]), q64)
    p = np.repeat(s.astype(np.int64) - q64, q64) + (np.arange(req.shape[0]) - starts[req])
    out = rows[req, p // block_size].astype(np.int64) * block_size + p % block_size
    if invalid_fraction > 0 and out.size:
        out[rng.random(out.size) < invalid_fraction] = PAD_SLOT_ID
    return out


def _seq_lens(cfg: ArenaConfig, q: np.ndarray, rng: np.random.Generator, max_seq_len: int,
              short_fraction: float) -> np.ndarray:
    hi = max(int(q.max()) + 1, min(max_seq_len, cfg.max_model_len))
    long = rng.integers(q, hi + 1)
    short = q + rng.integers(0, 64, size=q.shape[0])
    return np.where(rng.random(q.shape[0]) < short_fraction, np.minimum(short, hi), long).astype(
        np.int32
    )


def _query_lens(rng: np.random.Generator, n: int, num_decodes: int, cap: int, budget: int,
                longest: int, fewest_chunks: int) -> np.ndarray:
    """``num_decodes`` decodes of ``1..n`` tokens, then up to three chunks of ``n + 1 ..
    longest`` within ``cap`` requests and ``budget`` tokens: int32 ``(num_reqs,)``."""
    q = list(rng.integers(1, n + 1, size=num_decodes))
    budget -= sum(q)
    for _ in range(int(rng.integers(fewest_chunks if q else 1, 4))):
        if len(q) >= cap or budget <= n + 1:
            break
        chunk = int(rng.integers(n + 1, min(budget, longest) + 1))
        q.append(chunk)
        budget -= chunk
    return np.asarray(q or [1], dtype=np.int32)


def fixed_step(
    inputs: StepInputs,
    query_lens: np.ndarray,
    seq_lens: np.ndarray,
    rng: np.random.Generator,
    *,
    num_kv_blocks: int = NUM_KV_BLOCKS,
    rows: tuple[np.ndarray, np.ndarray | None] | None = None,
    invalid_fraction: float = 0.0,
) -> RandomStep:
    """The step of these lengths, its slots through random block-table rows: written now
    (``rows`` None), or the ``(main, swa)`` host rows :func:`write_block_rows` wrote
    before (steps of one trace share their requests' rows); that fraction of the slots
    -1. ``query_lens``, ``seq_lens``: host ints ``(num_reqs,)``."""
    q = np.asarray(query_lens, dtype=np.int32)
    s = np.asarray(seq_lens, dtype=np.int32)
    main, swa = rows if rows is not None else write_block_rows(inputs, s, rng, num_kv_blocks)
    return RandomStep(q, s, _slots(inputs.config, main, swa, q, s, rng, invalid_fraction))


def random_uniform_decode(
    inputs: StepInputs,
    num_reqs: int,
    rng: np.random.Generator,
    *,
    num_kv_blocks: int = NUM_KV_BLOCKS,
    max_seq_len: int | None = None,
    short_fraction: float = 0.3,
    invalid_fraction: float = 0.02,
) -> RandomStep:
    """``num_reqs`` decode requests of ``next_n`` tokens, long and short sequences."""
    cfg = inputs.config
    q = np.full(num_reqs, cfg.next_n, dtype=np.int32)
    s = _seq_lens(cfg, q, rng, max_seq_len or cfg.max_model_len, short_fraction)
    return fixed_step(inputs, q, s, rng, num_kv_blocks=num_kv_blocks,
                      invalid_fraction=invalid_fraction)


def random_mixed_step(
    inputs: StepInputs,
    rng: np.random.Generator,
    *,
    max_reqs: int | None = None,
    num_kv_blocks: int = NUM_KV_BLOCKS,
    max_seq_len: int | None = None,
    max_prefill_tokens: int = 512,
) -> RandomStep:
    """Decodes with variable accepted lengths ``1..next_n``, then a few extends/prefills."""
    cfg = inputs.config
    cap = min(max_reqs or cfg.max_num_seqs, cfg.max_num_seqs)
    num_dec = int(rng.integers(0, max(1, cap - 2)))
    q = _query_lens(rng, cfg.next_n, num_dec, cap, cfg.max_num_batched_tokens,
                    min(max_prefill_tokens, cfg.max_model_len), fewest_chunks=1)
    s = _seq_lens(cfg, q, rng, max_seq_len or cfg.max_model_len, 0.3)
    for b in range(num_dec, q.shape[0]):
        if rng.random() < 0.5:
            s[b] = q[b]  # a fresh prefill
    return fixed_step(inputs, q, s, rng, num_kv_blocks=num_kv_blocks)


class DecodeStream:
    """Uniform decode steps over persistent block tables, as an engine sees them: the tables
    are written once, and each step rewrites only ``rows_per_step`` random rows (requests
    that changed), so long runs cost little host->device traffic.

    Parameters
    ----------
    inputs : StepInputs
    rng : numpy Generator
    max_seq_len : int
        Longest sequence drawn; the tables cover it.
    """

    def __init__(self, inputs: StepInputs, rng: np.random.Generator, *,
                 max_seq_len: int | None = None, num_kv_blocks: int = NUM_KV_BLOCKS,
                 rows_per_step: int = 4, invalid_fraction: float = 0.02) -> None:
        cfg = inputs.config
        self.inputs, self.rng, self.cfg = inputs, rng, cfg
        self.max_seq_len = min(max_seq_len or cfg.max_model_len, cfg.max_model_len)
        self.num_kv_blocks, self.rows_per_step = num_kv_blocks, rows_per_step
        self.invalid_fraction = invalid_fraction
        # The cache groups' tables are written once: their rows never change the step's
        # host arrays, only what the builds read through them.
        self.main, self.swa = _write_rows(inputs, cfg.max_num_seqs, self.max_seq_len, rng,
                                          num_kv_blocks)

    def _rewrite(self, table: torch.Tensor, host: np.ndarray, rows: np.ndarray) -> None:
        fresh = block_ids(self.rng, self.num_kv_blocks, (rows.shape[0], host.shape[1]))
        host[rows] = fresh
        for i, row in enumerate(rows):
            table[int(row), : host.shape[1]].copy_(torch.from_numpy(fresh[i]))

    def next(self, num_reqs: int, longest: int | None = None) -> RandomStep:
        """A uniform decode step of ``num_reqs`` requests, sequences up to ``longest``
        (default and at most the stream's ``max_seq_len``: a context bucket's steps)."""
        return self._step(np.full(num_reqs, self.cfg.next_n, dtype=np.int32),
                          longest=longest)

    def next_mixed(self, max_tokens: int) -> RandomStep:
        """A step of any composition within ``max_tokens``: decodes first, each with
        ``1..next_n`` tokens (drafts accepted or not), then up to three prefill chunks
        (continuations or fresh prompts)."""
        cap = min(self.cfg.max_num_seqs, max_tokens)
        q = _query_lens(self.rng, self.cfg.next_n, int(self.rng.integers(0, max(1, cap - 3))),
                        cap, max_tokens, min(self.max_seq_len, 4096), fewest_chunks=0)
        return self._step(q, fresh_fraction=0.3)

    def _step(self, q: np.ndarray, fresh_fraction: float = 0.0,
              longest: int | None = None) -> RandomStep:
        cfg, rng = self.cfg, self.rng
        rows = rng.choice(cfg.max_num_seqs, size=min(self.rows_per_step, cfg.max_num_seqs),
                          replace=False)
        self._rewrite(self.inputs.block_table, self.main, rows)
        if self.swa is not None:
            self._rewrite(self.inputs.swa_block_table, self.swa, rows)
        top = self.max_seq_len if longest is None else min(longest, self.max_seq_len)
        s = _seq_lens(cfg, q, rng, top, 0.3)
        s = np.where((q > cfg.next_n) & (rng.random(q.shape[0]) < fresh_fraction), q, s)
        return RandomStep(q, s.astype(np.int32), _slots(cfg, self.main, self.swa, q, s, rng,
                                                        self.invalid_fraction))


class DeviceStepSource:
    """A producer for :class:`~staticattn.graphs.DeviceLengthSteps` that replays host-drawn
    steps: fixed-address device copies of a step (query starts int32 ``(R + 1,)``, lengths
    int32 ``(R,)``, slots int64 ``(T,)`` at the capacities) that :meth:`fill` writes before
    each launch, on the stream the graphs replay on, and that the captured producer copies
    into the arena's device input views. What a device-decided step computes is then known
    on the host, so it can be compared with the same step run from the host."""

    def __init__(self, cfg, device: torch.device) -> None:
        r, t = cfg.max_num_seqs, cfg.max_num_batched_tokens
        self.starts = torch.zeros(r + 1, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(r, dtype=torch.int32, device=device)
        self.slots = torch.full((t,), -1, dtype=torch.int64, device=device)

    def fill(self, step: RandomStep) -> None:
        """Write ``step`` for the next launch."""
        starts = np.concatenate([[0], np.cumsum(step.query_lens)]).astype(np.int32)
        self.starts[: starts.shape[0]].copy_(torch.from_numpy(starts))
        self.seq_lens[: step.seq_lens.shape[0]].copy_(
            torch.from_numpy(step.seq_lens.astype(np.int32)))
        self.slots[: step.slot_mapping.shape[0]].copy_(
            torch.from_numpy(step.slot_mapping.astype(np.int64)))

    def __call__(self, inputs: StepInputs, num_reqs: int, num_tokens: int) -> None:
        inputs.query_start_loc[: num_reqs + 1].copy_(self.starts[: num_reqs + 1])
        inputs.seq_lens[:num_reqs].copy_(self.seq_lens[:num_reqs])
        inputs.slot_mapping[:num_tokens].copy_(self.slots[:num_tokens])
