"""The oracle of the emulated ratio-2 compressor (``staticattn.distributed.pcp_ring_layer``)
over a run of global steps, plain loops over Python ints: every token's compressed value,
with the compressor ring as a dict that lives across the steps (0 where nothing was saved,
as the rings start)."""

from __future__ import annotations

#: Ring rows a request without speculative decoding (``Cap``).
CAPACITY = 8


def key(state: int, pos: int) -> int:
    """The key of the token at ``pos`` of the request of state index ``state``."""
    return (state * 7919 + pos * 40503 + 12345) & ((1 << 20) - 1)


def compressed_values(steps: list[dict]) -> list[list[int]]:
    """Per step (host lists ``query_lens``, ``num_computed``, ``req_state_idx``, ``table``:
    block rows, the ring block in column 0), every token's compressed value in global order:
    ``first << 20 | second`` at an odd position (the first half the token before it in the
    step, or at the step's first token of its request the ring's row saved for
    ``pos - 1``), -1 at an even one. After each step every request whose last position is
    even saves its last key."""
    ring: dict[int, int] = {}
    out = []
    for step in steps:
        values = []
        saves = {}
        for q, start, state, row in zip(step["query_lens"], step["num_computed"],
                                        step["req_state_idx"], step["table"]):
            block = row[0]
            for pos in range(start, start + q):
                if pos % 2 == 0:
                    values.append(-1)
                    continue
                first = (key(state, pos - 1) if pos > start
                         else ring.get(block * CAPACITY + (pos - 1) % CAPACITY, 0))
                values.append(first << 20 | key(state, pos))
            last = start + q - 1
            if q and last % 2 == 0:
                saves[block * CAPACITY + last % CAPACITY] = key(state, last)
        ring.update(saves)
        out.append(values)
    return out


def ring_reads(steps: list[dict], world: int) -> list[tuple[int, int]]:
    """``(step, rank)`` of every token that reads the ring at an odd position its request's
    previous step (the step before) left open: the token opens its request's step tokens,
    on the rank that holds its first row (a split prefill's chunk 0: rank 0; a decode: its
    owner, the decode's ordinal modulo ``world``)."""
    reads = []
    for s in range(1, len(steps)):
        before = {state: c + q for state, c, q in zip(
            steps[s - 1]["req_state_idx"], steps[s - 1]["num_computed"],
            steps[s - 1]["query_lens"])}
        decodes = 0
        step = steps[s]
        for state, start, pre in zip(step["req_state_idx"], step["num_computed"],
                                     step["is_prefilling"]):
            if start % 2 and before.get(state) == start:
                reads.append((s, 0 if pre else decodes % world))
            decodes += not pre
    return reads
