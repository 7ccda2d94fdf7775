"""Oracle of the sparse sliding-window builder: plain Python loops over host lists, written
from the spec's words (vllm-semantics §3.2, §6.5-§6.8, §7) and nothing else.

Documented deviations from the reference that the oracle states (DESIGN "Semantics"):
invalid and padded decode tokens get length 0 and index rows of -1 (SWA and dense alike);
``token_to_req_indices`` covers every token, padded tokens mapping to request 0; dense
prefill rows come with their lengths, and a build hands them a chunk of consecutive prefill
rows at a time (:func:`assert_dense_chunks` compares each chunk with its slice of the rows
listed here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from staticattn.reference.assertions import holds, same
from staticattn.reference.indexer import split_decodes_and_prefills

if TYPE_CHECKING:
    from staticattn.arena import ArenaConfig
    from staticattn.reference.step import HostStep

__all__ = ["SWAExpected", "assert_dense_chunks", "assert_matches", "dense_count",
           "dense_prefill_row", "dense_row",
           "expected", "expected_for_step", "layer_types", "split", "swa_row"]


@dataclass
class SWAExpected:
    num_decodes: int
    num_prefills: int
    num_decode_tokens: int
    num_prefill_tokens: int
    is_valid_token: list[bool]
    token_to_req_indices: list[int]
    decode_swa_indices: list[list[int]]
    decode_swa_lens: list[int]
    dense_decode_indices: list[list[int]] | None
    dense_decode_lens: list[int] | None
    prefill_seq_lens: list[int] | None
    prefill_gather_lens: list[int] | None
    dense_prefill_indices: list[list[int]] | None
    dense_prefill_lens: list[int] | None
    window: int
    dense_width: int
    layer_types: list[str] = field(default_factory=list)


def layer_types(compress_ratios) -> list[str]:
    """Spec §6.1 (DeepSeek V4's encoding): ratio <= 1 -> swaonly, 4 -> c4a, 128 -> c128a;
    present types only."""
    names = {4: "c4a", 128: "c128a"}
    present = {"swaonly" if r <= 1 else names[r] for r in (compress_ratios or [1])}
    return [name for name in ("swaonly", "c4a", "c128a") if name in present]


def split(query_lens: list[int], num_tokens: int, threshold: int) -> tuple[int, int, int, int]:
    """Spec §3.2, non-uniform, short extends are decodes: the indexer oracle's split."""
    return split_decodes_and_prefills(query_lens, max(query_lens, default=0), num_tokens,
                                      threshold, require_uniform=False)


def swa_row(cfg: ArenaConfig, swa_table_row: list[int], p: int) -> tuple[list[int], int]:
    """Spec §6.6: the window of a decode token at position ``p``, as flat SWA slots."""
    W, bs = cfg.sliding_window, cfg.swa_block_size
    row = [-1] * W
    start = max(p - W + 1, 0)
    n = max(p + 1 - start, 0)
    for o in range(n):
        pos = start + o
        row[o] = swa_table_row[pos // bs] * bs + pos % bs
    return row, n


def dense_ratio(cfg: ArenaConfig) -> int:
    """``R`` of the model's layer type that reads every complete compressed entry (C128A:
    128; spec §7)."""
    return cfg.dense_layer_type.compress_ratio


def dense_width(cfg: ArenaConfig) -> int:
    """Spec §7: ``maxC = round_up(cdiv(max_model_len, R), 128)``."""
    entries = -(-cfg.max_model_len // dense_ratio(cfg))
    return -(-entries // 128) * 128


def dense_count(cfg: ArenaConfig, p: int) -> int:
    """Spec §7: the complete ``R``-token groups at or before position ``p``, capped at maxC."""
    return min(max(p + 1, 0) // dense_ratio(cfg), dense_width(cfg))


def dense_row(cfg: ArenaConfig, table_row: list[int], p: int) -> tuple[list[int], int]:
    """Spec §7: a decode token's dense top-k as flat slots of the main group. Under decode
    context parallelism C128A is replicated and a main-table column spans ``block_size *
    dcp_world_size`` tokens, so a dense page holds that many tokens' entries."""
    per_block = cfg.block_size * cfg.dcp_world_size // dense_ratio(cfg)
    n = dense_count(cfg, p)
    row = [-1] * dense_width(cfg)
    for o in range(n):
        row[o] = table_row[o // per_block] * per_block + o % per_block
    return row, n


def dense_prefill_row(cfg: ArenaConfig, p: int) -> tuple[list[int], int]:
    """Spec §7: a prefill token's dense row holds the local indices ``o < n_c``."""
    n = dense_count(cfg, p)
    return list(range(n)) + [-1] * (dense_width(cfg) - n), n


def expected(
    cfg: ArenaConfig,
    query_lens: list[int],
    seq_lens: list[int],
    slot_mapping: list[int],
    swa_block_table: list[list[int]],
    block_table: list[list[int]],
    num_reqs_padded: int,
    num_tokens_padded: int,
) -> SWAExpected:
    """Every output field for one step; lists are over the padded extents."""
    W = cfg.sliding_window
    q = list(query_lens) + [0] * (num_reqs_padded - len(query_lens))
    L = list(seq_lens) + [0] * (num_reqs_padded - len(seq_lens))
    slots = list(slot_mapping) + [-1] * (num_tokens_padded - len(slot_mapping))
    owner, position = [], []
    for b in range(num_reqs_padded):
        owner += [b] * q[b]
        position += [L[b] - q[b] + j for j in range(q[b])]
    owner += [0] * (num_tokens_padded - len(owner))
    position += [0] * (num_tokens_padded - len(position))

    D, P, Td, Tp = split(q, num_tokens_padded, cfg.decode_threshold)
    valid = [s >= 0 for s in slots]

    rows = [swa_row(cfg, swa_block_table[owner[t]], position[t]) if valid[t] else ([-1] * W, 0)
            for t in range(Td)]
    swa_rows, swa_lens = [r for r, _ in rows], [n for _, n in rows]

    c_rows = c_lens = cp_rows = cp_lens = None
    if cfg.dense_layer_type is not None:
        rows = [dense_row(cfg, block_table[owner[t]], position[t]) if valid[t]
                else ([-1] * dense_width(cfg), 0) for t in range(Td)]
        c_rows, c_lens = [r for r, _ in rows], [n for _, n in rows]
        if P > 0:
            rows = [dense_prefill_row(cfg, position[t]) for t in range(Td, Td + Tp)]
            cp_rows, cp_lens = [r for r, _ in rows], [n for _, n in rows]

    pre_seq = pre_gather = None
    if P > 0:
        pre_seq = L[D : D + P]
        pre_gather = [q[r] + min(L[r] - q[r], W - 1) for r in range(D, D + P)]

    return SWAExpected(
        num_decodes=D, num_prefills=P, num_decode_tokens=Td, num_prefill_tokens=Tp,
        is_valid_token=valid, token_to_req_indices=owner,
        decode_swa_indices=swa_rows, decode_swa_lens=swa_lens,
        dense_decode_indices=c_rows, dense_decode_lens=c_lens,
        prefill_seq_lens=pre_seq, prefill_gather_lens=pre_gather,
        dense_prefill_indices=cp_rows, dense_prefill_lens=cp_lens, window=W,
        dense_width=dense_width(cfg) if cfg.dense_layer_type is not None else 0,
        # The config's types (the encoding itself is checked against layer_types()).
        layer_types=[t.name for t in cfg.layer_types],
    )


def expected_for_step(cfg: ArenaConfig, step: HostStep) -> SWAExpected:
    """:func:`expected` for a :class:`~staticattn.reference.step.HostStep`."""
    return expected(
        cfg,
        [int(x) for x in step.query_lens],
        [int(x) for x in step.seq_lens],
        [int(x) for x in step.slot_mapping],
        step.swa_block_table.tolist(),
        step.block_table.tolist(),
        step.num_reqs_padded,
        step.num_tokens_padded,
    )


def assert_matches(meta, exp: SWAExpected) -> None:
    """Every field of a ``SparseSWAMetadata`` equals the oracle's (shapes included)."""
    for name in ("num_decodes", "num_prefills", "num_decode_tokens", "num_prefill_tokens"):
        same(name, getattr(meta, name), getattr(exp, name))
    td = exp.num_decode_tokens
    same("is_valid_token", meta.is_valid_token, exp.is_valid_token)
    same("token_to_req_indices", meta.token_to_req_indices, exp.token_to_req_indices)
    same("decode_swa_indices.shape", tuple(meta.decode_swa_indices.shape), (td, 1, exp.window))
    same("decode_swa_indices[:, 0]", meta.decode_swa_indices[:, 0], exp.decode_swa_indices)
    same("decode_swa_lens", meta.decode_swa_lens, exp.decode_swa_lens)
    if exp.dense_decode_indices is None:
        holds(meta.dense_decode_indices is None and meta.dense_decode_lens is None,
              "no dense decode metadata")
    else:
        same("dense_decode_indices.shape", tuple(meta.dense_decode_indices.shape),
             (td, 1, exp.dense_width))
        same("dense_decode_indices[:, 0]", meta.dense_decode_indices[:, 0],
             exp.dense_decode_indices)
        same("dense_decode_lens", meta.dense_decode_lens, exp.dense_decode_lens)
    _optional(meta, exp, ("prefill_seq_lens", "prefill_gather_lens"), "prefill metadata")
    if exp.dense_prefill_indices is None:
        holds(meta.dense_prefill is None, "no dense prefill metadata")
    else:
        assert_dense_chunks(meta.dense_prefill, exp.dense_prefill_indices,
                            exp.dense_prefill_lens)
    for layer_type in ("swaonly", "c4a", "c128a"):
        plan = meta.tile_sched(layer_type)
        if td and layer_type in exp.layer_types:
            holds(plan is not None and not plan.have_initialized,
                  f"an uninitialised tile plan for {layer_type}")
            holds(plan.tile_scheduler_metadata is None and plan.num_splits is None,
                  f"an empty tile plan for {layer_type}")
        else:
            holds(plan is None, f"no tile plan for {layer_type}")


def assert_dense_chunks(chunks, rows: list[list[int]], lens: list[int]) -> None:
    """Each chunk of ``chunks`` (a build's ``DensePrefillChunks``), written in turn, holds
    the slice of the prefill rows ``rows`` and lengths ``lens`` (one per prefill row of the
    build's extent) that starts at its first row, and the chunks cover them all: ``rows`` is
    what a buffer of one row per prefill token holds."""
    same("dense_prefill.num_prefill_tokens", chunks.num_prefill_tokens, len(rows))
    covered = 0
    for c in range(chunks.num_chunks):
        indices, chunk_lens = chunks.write(c)
        first = chunks.first_row(c)
        same(f"dense_prefill chunk {c} first row", first, covered)
        covered += indices.shape[0]
        # Lengths first: a wrong length (the position) and a stale row past a right length
        # (an earlier chunk) then fail with different names.
        same(f"dense_prefill chunk {c} lens", chunk_lens, lens[first:covered])
        same(f"dense_prefill chunk {c} indices", indices, rows[first:covered])
    same("dense_prefill rows covered", covered, len(rows))


def _optional(meta, exp: SWAExpected, names: tuple[str, ...], what: str) -> None:
    """The fields ``names`` equal the oracle's, or are all None where the oracle has none."""
    if getattr(exp, names[0]) is None:
        holds(all(getattr(meta, name) is None for name in names), f"no {what}")
        return
    for name in names:
        same(name, getattr(meta, name), getattr(exp, name))
