"""What the gather consumer must write for every token, from the step alone (no metadata):
the cache entries attention would read, summed (see staticattn.consumers.gather).

* SWA: positions ``max(p - W + 1, 0) .. p`` through the SWA block table;
* C128A: the ``min((p + 1) // R, maxC)`` complete compressed entries through the main
  block table (``block_size // R`` entries per block, ``R = 128``);
* indexer: the last ``min(n, 32)`` of the ``n = (p + 1) // R`` compressed keys through the
  main block table (``storage_block_size`` entries per block).

A decode token (query length at most ``next_n``, before the first longer request) whose slot
is -1 reads nothing through the SWA and C128A metadata (length 0); the indexer does not look
at slots.
"""

from __future__ import annotations

__all__ = ["TAIL", "expected"]

from staticattn.reference.swa import dense_ratio, dense_width

TAIL = 32


def expected(cfg, step, swa_cache, c128a_cache, index_cache, num_tokens: int) -> list[list[int]]:
    """``num_tokens`` rows of ``[swa, c128a, indexer]`` sums (ints; rows past the step's
    real tokens ``[0, 0, 0]``) for a :class:`~staticattn.reference.step.HostStep`; each cache
    is a flat sequence of ints indexed by slot (``cache[slot]``)."""
    rows = []
    q = [int(x) for x in step.query_lens]
    d = 0
    while d < len(q) and q[d] <= cfg.decode_threshold:
        d += 1
    td = sum(q[:d])
    t = 0
    for b, (qb, L) in enumerate(zip(q, step.seq_lens)):
        for j in range(qb):
            p = int(L) - qb + j
            dead = t < td and int(step.slot_mapping[t]) < 0
            rows.append([
                0 if dead or not cfg.has_swa else _swa(cfg, step, b, p, swa_cache),
                0 if dead or cfg.dense_layer_type is None else _c128a(cfg, step, b, p,
                                                                         c128a_cache),
                _index(cfg, step, b, p, index_cache),
            ])
            t += 1
    return rows + [[0, 0, 0]] * (num_tokens - t)


def _swa(cfg, step, b, p, cache) -> int:
    bs = cfg.swa_block_size
    row = step.swa_block_table[b]
    return sum(int(cache[int(row[pos // bs]) * bs + pos % bs])
               for pos in range(max(p - cfg.sliding_window + 1, 0), p + 1))


def _c128a(cfg, step, b, p, cache) -> int:
    per = cfg.block_size // dense_ratio(cfg)
    row = step.block_table[b]
    n = min(max(p + 1, 0) // dense_ratio(cfg), dense_width(cfg))
    return sum(int(cache[int(row[o // per]) * per + o % per]) for o in range(n))


def _index(cfg, step, b, p, cache) -> int:
    size = cfg.storage_block_size
    row = step.block_table[b]
    n = max(p + 1, 0) // cfg.index_compress_ratio
    return sum(int(cache[int(row[k // size]) * size + k % size])
               for k in range(max(n - TAIL, 0), n))
