"""Oracle of DeepSeek V4.1's compressed metadata, written as plain loops from the spec's words
(``docs/spec/deepseek-v41.md`` §4-§7, §10), with staticattn's documented differences:
padded tokens get ring slot -1 (the reference's FULL graphs give them request 0's slot,
§5.3), and the decode top-k operand of an invalid token is a row of -1 with length 0.

A step is a :class:`V41Step`: a :class:`~staticattn.reference.step.HostStep` (the staged slot
mapping is the SWA group's) plus one block table per cache group, ``"<type>.<cache>"``, and
the requests' bounded-replay starts (§8.1): the reference's ``_pad_replayed_slots_kernel``
turns the slots of replayed tokens to -1 in the compressed and index-K groups, which the
own-slot rule then reads (:func:`group_own_slots`). The
indexer's decode lengths and prefill chunks follow the same formulas as V4's with the type's
ratio, so :func:`indexer_metadata` and :func:`mixed_indexer` hand the V3.2/V4 oracles a view
of the config and step per type and replace the slot mapping, which V4.1 computes from the
group's table with the own-slot rule (§5.2).

Nothing here calls staticattn's kernels.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from staticattn.reference import indexer as indexer_oracle
from staticattn.reference import mixed as mixed_oracle

RATIOS = {"c1a": 1, "c2a": 2}


@dataclass
class V41Step:
    """A host step, its cache groups' block tables (real rows, int32 ``(num_reqs, C)``) and
    each request's replay start as a prefilling request carries it (None: all 0)."""

    step: object
    tables: dict[str, np.ndarray]
    replay_start: list[int] | None = None

    def rows(self, group: str, num_reqs: int) -> list[list[int]]:
        """:func:`padded_rows` of the group's table."""
        return padded_rows(self.tables[group], num_reqs)


def padded_rows(table, num_reqs: int) -> list[list[int]]:
    """A host table as lists, padded requests' rows all 0 (the null block)."""
    real = [list(map(int, row)) for row in table]
    return real + [[0] * len(real[0])] * (num_reqs - len(real))


def ring_capacity(num_spec: int) -> int:
    """§2.3: ``max(8, next_pow2(num_spec + 2))``."""
    cap = 1
    while cap < num_spec + 2:
        cap *= 2
    return max(8, cap)


def tokens(step) -> tuple[list[int], list[int], list[int]]:
    """Per real token: (request, position, own slot)."""
    _, owner, position = mixed_oracle.tokens(step)
    return owner, position, [int(s) for s in step.slot_mapping]


def group_own_slots(v41: V41Step, window: int) -> list[int]:
    """§8.1: a token's slot in the compressed and index-K groups -- the staged (SWA) slot,
    -1 where its request replays it: ``replay_start > 0`` and ``replay_start <= p <
    replay_start + W`` (a request with ``replay_start = 0`` is skipped)."""
    owner, position, own = tokens(v41.step)
    starts = v41.replay_start or [0] * len(v41.step.query_lens)
    return [-1 if 0 < starts[b] <= p < starts[b] + window else slot
            for b, p, slot in zip(owner, position, own)]


def compressed_slots(ratio: int, entries: int, table, owner, position, own, num_tokens,
                     gate: bool = True) -> list[int]:
    """§5.1-§5.2: the token at ``p`` writes entry ``k = p // R`` iff ``(p + 1) % R == 0`` and
    (V4.1) its own slot is not -1: ``bt[b, k // S] * S + k % S``; everything else -1."""
    out = [-1] * num_tokens
    for t, (b, p) in enumerate(zip(owner, position)):
        if (p + 1) % ratio == 0 and (not gate or own[t] != -1):
            k = p // ratio
            out[t] = table[b][k // entries] * entries + k % entries
    return out


def entry_counts(ratio: int, position, num_tokens) -> list[int]:
    """§6: ``n_c(p) = floor((p + 1) / R)``; padded tokens 0."""
    return [(p + 1) // ratio for p in position] + [0] * (num_tokens - len(position))


def ring_slots(ring_table, cap: int, owner, position, num_tokens) -> list[int]:
    """§5.3: ``ring_block(b) * cap + p % cap``, -1 for the null ring block 0 and (ours) for
    padded tokens."""
    out = [-1] * num_tokens
    for t, (b, p) in enumerate(zip(owner, position)):
        block = ring_table[b][0]
        if block != 0:
            out[t] = block * cap + p % cap
    return out


def global_topk(topk_rows, owner, valid, table, entries):
    """§7.1: ``bt[b, k // S] * S + k % S`` per ``k >= 0``, -1 stays -1; the length counts
    ``k >= 0``; an invalid token: a row of -1, length 0."""
    rows, lens = [], []
    for t, row in enumerate(topk_rows):
        if not valid[t]:
            rows.append([-1] * len(row))
            lens.append(0)
            continue
        b = owner[t]
        rows.append([table[b][k // entries] * entries + k % entries if k >= 0 else -1
                     for k in row])
        lens.append(sum(1 for k in row if k >= 0))
    return rows, lens


def compressed(cfg, v41: V41Step, num_reqs: int, num_tokens: int) -> dict:
    """Per kv-source type: ``slot_mapping``, ``entry_counts`` and (c2a) ``ring_slot_mapping``
    over ``num_tokens`` tokens of ``num_reqs`` requests (padding included)."""
    owner, position, _ = tokens(v41.step)
    own = group_own_slots(v41, cfg.sliding_window)
    out = {}
    for name, ratio in RATIOS.items():
        entries = cfg.block_size // ratio
        kv = v41.rows(f"{name}.compressed_kv", num_reqs)
        want = dict(
            slot_mapping=compressed_slots(ratio, entries, kv, owner, position, own, num_tokens),
            entry_counts=entry_counts(ratio, position, num_tokens))
        ring = f"{name}.compressor_state"
        if ring in v41.tables:
            want["ring_slot_mapping"] = ring_slots(
                v41.rows(ring, num_reqs), ring_capacity(cfg.num_speculative_tokens), owner,
                position, num_tokens)
        out[name] = want
    return out


def index_k_slots(cfg, v41: V41Step, name: str, num_reqs: int, num_tokens: int) -> list[int]:
    """§5.2: the index-K slot mapping of type ``name`` (the compressed rule on its own
    group's table)."""
    owner, position, _ = tokens(v41.step)
    ratio = RATIOS[name]
    return compressed_slots(ratio, cfg.block_size // ratio,
                            v41.rows(f"{name}.index_k", num_reqs), owner, position,
                            group_own_slots(v41, cfg.sliding_window), num_tokens)


class _TypeConfig:
    """The config as the V3.2/V4 indexer oracles read it, for one index type."""

    def __init__(self, cfg, name: str) -> None:
        self._cfg = cfg
        self.index_compress_ratio = RATIOS[name]
        self.storage_block_size = cfg.block_size // RATIOS[name]

    def __getattr__(self, attr):
        return getattr(self._cfg, attr)


def type_view(cfg, v41: V41Step, name: str):
    """(config, HostStep) as the V3.2/V4 indexer oracles read them for index type ``name``:
    its ratio and entries per block, its index-K table as the step's block table."""
    view = _TypeConfig(cfg, name)
    view.max_blocks_per_req = v41.tables[f"{name}.index_k"].shape[1]
    return view, dataclasses.replace(v41.step, block_table=v41.tables[f"{name}.index_k"])


def indexer_metadata(cfg, v41: V41Step, name: str, *, graph: bool = False) -> dict:
    """Every field of ``IndexerMetadataBuilder(name).build`` (``graph``: ``build_decode``)."""
    view, step = type_view(cfg, v41, name)
    want = indexer_oracle.indexer_metadata(view, step, graph=graph)
    want["slot_mapping"] = index_k_slots(cfg, v41, name, step.num_reqs_padded,
                                         step.num_tokens_padded)
    return want


def mixed_indexer(cfg, v41: V41Step, name: str, num_reqs: int, num_tokens: int,
                  chunk_rows: int) -> dict:
    """Every field of ``IndexerMetadataBuilder(name).build_mixed`` for a bucket."""
    view, step = type_view(cfg, v41, name)
    want = mixed_oracle.indexer(view, step, num_reqs, num_tokens, chunk_rows)
    want["slot_mapping"] = index_k_slots(cfg, v41, name, num_reqs, num_tokens)
    return want
