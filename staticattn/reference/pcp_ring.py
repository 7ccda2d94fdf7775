"""Oracle of DeepSeek V4.1's prefill-context-parallel cache inputs
(``prefill-context-parallel.md`` §4.2), plain loops over Python ints. V4.1's PCP has D = 1.

* ``cache_positions``: the position of every gathered token (0 for padding), the positions
  the SWA, compressor and indexer caches are written at.
* the ratio-``R`` compressed slot mapping of the gathered tokens: the token at ``pos`` with
  ``(pos + 1) % R == 0`` completes state ``pos // R`` and writes it at
  ``block_row[state // bs_c] * bs_c + state % bs_c``; every other token, and padding, -1.
* ring linking of the ratio-2 compressor: a 2-token group may straddle two chunks held by
  different ranks. With ``R`` rows a rank (gathered row index ``rank * R + row``), a row
  starting at an odd position takes the first half of its group from the row that ends just
  before it (``prev_row_indices``), and the newest row of each request whose last position is
  even leaves an open group, written to ``ring_block * Cap + pos % Cap``
  (``ring_write_slots``). Worked example (P=4, q = (37, 100), ring blocks 5 and 9, R = 8):
  rank 0's A[35,37) links to rank 1's A[30,35), gathered row 9; only gathered row 1 (A ends
  at 36) writes the ring, at 5*8 + 36 % 8 = 44.
"""

from __future__ import annotations

from staticattn.reference.pcp_layout import GlobalBatch, Layout

__all__ = ["cache_positions", "compressed_gathered_slots", "ring_links"]


def cache_positions(batch: GlobalBatch, lay: Layout) -> list[int]:
    """The position of each of the ``P N`` gathered tokens, 0 for padding."""
    positions = []
    for rows in lay.rows:
        for row in rows:
            start = batch.num_computed[row.req] + row.offset
            positions += range(start, start + row.length)
        positions += [0] * (lay.N - sum(r.length for r in rows))
    return positions


def compressed_gathered_slots(batch: GlobalBatch, lay: Layout, block_table: list[list[int]],
                              block_size: int, ratio: int) -> list[int]:
    """The compressed slot of each gathered token (``P N``), with the compressed cache's
    per-request ``block_table`` of ``block_size`` states a block."""
    positions, out = cache_positions(batch, lay), []
    for k, (g, real) in enumerate(zip(lay.padded_gather_idx, lay.write_mask)):
        pos = positions[k]
        if not real or (pos + 1) % ratio:
            out.append(-1)
            continue
        req = next(i for i in range(len(batch.query_lens))
                   if batch.query_start_loc[i] <= g < batch.query_start_loc[i + 1])
        state = pos // ratio
        out.append(block_table[req][state // block_size] * block_size + state % block_size)
    return out


def ring_links(batch: GlobalBatch, lay: Layout, ring_block: list[int], rows_per_rank: int,
               ring_size: int = 8) -> dict[str, list[int]]:
    """``prev_row_indices`` (per rank, one per row) and ``ring_write_slots``
    (``P * rows_per_rank``) of the gathered rows. Keys are requests here (each has its own
    ring block), and the newest row of a request is found by comparing every pair."""
    # (request, first position, last position) of each gathered row, None when empty.
    spans: list[tuple[int, int, int] | None] = []
    for rows in lay.rows:
        for row in rows:
            start = batch.num_computed[row.req] + row.offset
            spans.append((row.req, start, start + row.length - 1) if row.length else None)
        spans += [None] * (rows_per_rank - len(rows))
    write = [-1] * len(spans)
    prev = [-1] * len(spans)
    for k, span in enumerate(spans):
        if span is None:
            continue
        req, first, last = span
        newest = all(s is None or s[0] != req or s[2] <= last for s in spans)
        if newest and last % 2 == 0:
            write[k] = ring_block[req] * ring_size + last % ring_size
        if first % 2:
            prev[k] = next((m for m, s in enumerate(spans)
                            if s is not None and s[0] == req and s[2] == first - 1), -1)
    R = rows_per_rank
    return {"prev_row_indices": [prev[p * R:p * R + len(rows)] for p, rows in enumerate(lay.rows)],
            "ring_write_slots": write}
