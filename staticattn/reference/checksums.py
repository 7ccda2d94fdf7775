"""What the gather consumer must write for every token, from the step alone (no metadata):
the cache entries attention would read, summed (see staticattn.consumers.emulated.gather).

* SWA: positions ``max(p - W + 1, 0) .. p`` through the SWA block table;
* C128A: the ``min((p + 1) // R, maxC)`` complete compressed entries through the main
  block table (``block_size // R`` entries per block, ``R = 128``);
* indexer: the last ``min(n, 32)`` of the ``n = (p + 1) // R`` compressed keys through the
  main block table (``storage_block_size`` entries per block).

A decode token (query length at most ``next_n``, before the first longer request) whose slot
is -1 reads nothing through the SWA and dense metadata (length 0); the indexer does not look
at slots.

DeepSeek V4.1 (:func:`expected_v41`, columns ``swa, dense, indexer.c1a, indexer.c2a,
c1a.read, c1a.write, c2a.read, c2a.write``): each index type's keys ``n = (p + 1) // R``
through its ``<type>.index_k`` table (``block_size // R`` entries per block); per kv-source
type the last ``min(n, 32)`` of its ``n`` compressed entries through its
``<type>.compressed_kv`` table (read), and the entry the token writes (``(p + 1) % R == 0``
and its own slot not -1) plus its compressor-ring row (``ring_block * cap + p % cap``, none
for the null ring block 0) (write).
"""

from __future__ import annotations

__all__ = ["TAIL", "expected", "expected_v41"]

from staticattn.reference import v41_compressed as v41_oracle
from staticattn.reference.swa import dense_ratio, dense_width
from staticattn.reference.v41_swa import num_decodes

TAIL = 32


def expected(cfg, step, swa_cache, dense_cache, index_cache, num_tokens: int) -> list[list[int]]:
    """``num_tokens`` rows of ``[swa, dense, indexer]`` sums (ints; rows past the step's
    real tokens ``[0, 0, 0]``) for a :class:`~staticattn.reference.step.HostStep`; each cache
    is a flat sequence of ints indexed by slot (``cache[slot]``)."""
    rows = [[swa, dense, _tail(index_cache, step.block_table[b], cfg.storage_block_size,
                               max(p + 1, 0) // cfg.index_compress_ratio)]
            for b, p, swa, dense in _windows(cfg, step, swa_cache, dense_cache, None)]
    return rows + [[0, 0, 0]] * (num_tokens - len(rows))


def _windows(cfg, step, swa_cache, dense_cache, replay_start):
    """Per real token ``(request, position, swa sum, dense sum)``; a prefill token's SWA
    window starts no earlier than its request's ``replay_start`` (None: all 0)."""
    q = [int(x) for x in step.query_lens]
    td = sum(q[:num_decodes(q, cfg.decode_threshold)])
    t = 0
    for b, (qb, L) in enumerate(zip(q, step.seq_lens)):
        for j in range(qb):
            p = int(L) - qb + j
            dead = t < td and int(step.slot_mapping[t]) < 0
            start = int(replay_start[b]) if replay_start is not None and t >= td else 0
            yield (b, p, 0 if dead or not cfg.has_swa else _swa(cfg, step, b, p, swa_cache,
                                                                 start),
                   0 if dead or cfg.dense_layer_type is None else _dense(cfg, step, b, p,
                                                                         dense_cache))
            t += 1


def _swa(cfg, step, b, p, cache, replay_start: int = 0) -> int:
    bs = cfg.swa_block_size
    row = step.swa_block_table[b]
    return sum(int(cache[int(row[pos // bs]) * bs + pos % bs])
               for pos in range(max(p - cfg.sliding_window + 1, replay_start, 0), p + 1))


def _dense(cfg, step, b, p, cache) -> int:
    per = cfg.block_size // dense_ratio(cfg)
    row = step.block_table[b]
    n = min(max(p + 1, 0) // dense_ratio(cfg), dense_width(cfg))
    return sum(int(cache[int(row[o // per]) * per + o % per]) for o in range(n))


def expected_v41(cfg, v41, caches: dict, num_tokens: int) -> list[list[int]]:
    """``num_tokens`` rows of the eight DeepSeek V4.1 sums (rows past the real tokens all 0)
    for a :class:`~staticattn.reference.v41_compressed.V41Step`; ``caches`` by the gather
    consumer's names (``"swa"``, ``"indexer.c1a"``, ``"c2a.compressed_kv"``,
    ``"c2a.compressor_state"``, ...), each a flat sequence of ints indexed by slot."""
    own = v41_oracle.group_own_slots(v41, cfg.sliding_window)
    cap = v41_oracle.ring_capacity(cfg.num_speculative_tokens)
    rows = []
    for t, (b, p, swa, dense) in enumerate(_windows(cfg, v41.step, caches["swa"],
                                                     caches["dense"], v41.replay_start)):
        row = [swa, dense]
        for name, ratio in v41_oracle.RATIOS.items():
            per = cfg.block_size // ratio
            table = v41.tables[f"{name}.index_k"][b]
            row.append(_tail(caches[f"indexer.{name}"], table, per, (p + 1) // ratio))
        for name, ratio in v41_oracle.RATIOS.items():
            per = cfg.block_size // ratio
            kv = caches[f"{name}.compressed_kv"]
            row.append(_tail(kv, v41.tables[f"{name}.compressed_kv"][b], per, (p + 1) // ratio))
            written = 0
            if (p + 1) % ratio == 0 and own[t] != -1:
                k = p // ratio
                written += int(kv[int(v41.tables[f"{name}.compressed_kv"][b][k // per]) * per
                                  + k % per])
            ring = v41.tables.get(f"{name}.compressor_state")
            if ring is not None and int(ring[b][0]) != 0:
                written += int(caches[f"{name}.compressor_state"][int(ring[b][0]) * cap
                                                                  + p % cap])
            row.append(written)
        rows.append(row)
    return rows + [[0] * 8] * (num_tokens - len(rows))


def _tail(cache, table_row, per: int, n: int) -> int:
    """The last ``min(n, TAIL)`` of ``n`` entries through one block-table row."""
    return sum(int(cache[int(table_row[k // per]) * per + k % per])
               for k in range(max(n - TAIL, 0), n))
