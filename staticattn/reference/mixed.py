"""Oracle of the mixed builds (a step of any composition, built for a token bucket of
``R`` requests and ``T`` tokens), in plain loops over host lists.

The rules are the reference's (spec §3.2, §4.5-§4.9, §6.6-§6.7, §7), applied to the bucket's
fixed layout, which staticattn documents:

* the split is the non-uniform one, decode threshold ``next_n`` (``D`` leading requests with
  ``q <= next_n``, ``Td`` their tokens);
* indexer decodes: ``next_n = 1`` native, one row per request slot (``R`` rows); MTP
  flattened into one row per token slot (``min(T, max_decode_tokens)`` rows); rows past the
  real decodes have length 0 (and an all-zero expanded table row);
* indexer prefills: the greedy chunk plan as a table of ``[req_start, req_end, token_start,
  token_end, total_seq_lens, skip_kv_gather, 0, 0]`` rows (chunks without keys dropped), the
  key prefix sums of each request range in ``cu_seq_lens[2s : s + e + 1]``, the keys of a
  request's range before it, and each prefill token's ``ks``/``ke`` at its global index;
  everything else 0;
* SWA and dense rows of decode tokens past ``Td`` and dense prefill rows past the real
  prefill tokens: length 0, rows of -1; prefill gather and sequence lengths past the real
  prefills: 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from staticattn.reference import indexer as indexer_oracle
from staticattn.reference import swa as swa_oracle
from staticattn.reference.assertions import holds, same
from staticattn.reference.v41_swa import num_decodes

if TYPE_CHECKING:
    from staticattn.arena import ArenaConfig

__all__ = ["assert_indexer_matches", "assert_swa_matches", "counts", "indexer", "swa",
           "tokens"]


def counts(cfg: ArenaConfig, step) -> list[int]:
    """``[k, nt, D, Td]`` of a ``HostStep`` (real values, no padding)."""
    q = [int(x) for x in step.query_lens]
    d = num_decodes(q, cfg.decode_threshold)
    return [len(q), sum(q), d, sum(q[:d])]


def tokens(step) -> tuple[list[int], list[int], list[int]]:
    """(qsl, owner, position) over the real tokens."""
    qsl, owner, position = [0], [], []
    for b, (q, L) in enumerate(zip(step.query_lens, step.seq_lens)):
        q, L = int(q), int(L)
        qsl.append(qsl[-1] + q)
        owner += [b] * q
        position += [L - q + j for j in range(q)]
    return qsl, owner, position


def indexer(cfg: ArenaConfig, step, num_reqs: int, num_tokens: int, chunk_rows: int) -> dict:
    """Every output of ``IndexerMetadataBuilder.build_mixed`` for a bucket of ``num_reqs``
    requests and ``num_tokens`` tokens, as a dict of plain ints and lists (the keys of
    :func:`assert_indexer_matches`): per-token lists are ``num_tokens`` long, per-request
    lists ``num_reqs`` long, ``chunk_bounds`` ``chunk_rows`` rows of 8 ints."""
    k, nt, d, td = counts(cfg, step)
    n, ratio = cfg.next_n, cfg.index_compress_ratio
    qsl, owner, position = tokens(step)
    seq = [int(x) for x in step.seq_lens]
    table = [list(map(int, row)) for row in step.block_table]
    padded_qsl = qsl + [nt] * (num_reqs - k)
    padded_seq = seq + [0] * (num_reqs - k)
    padded_table = table + [[0] * len(table[0])] * (num_reqs - k)
    if cfg.dcp_world_size > 1:
        slots = None  # each rank's own: staticattn.reference.dcp_indexer
    elif ratio > 1:
        slots = indexer_oracle.compressed_slot_mapping(
            padded_qsl, padded_seq, padded_table, cfg.storage_block_size, ratio, num_tokens)
    else:
        slots = [int(s) for s in step.slot_mapping] + [-1] * (num_tokens - nt)
    if n > 1:
        rows = min(num_tokens, cfg.max_decode_tokens)
        lens = [[(position[t] + 1) // ratio] if t < td else [0] for t in range(rows)]
        blocks = [table[owner[t]] if t < td else [0] * len(table[0]) for t in range(rows)]
        decode_lens = [1] * rows
    else:
        lens = [[seq[b] // ratio] if b < d else [0] for b in range(num_reqs)]
        blocks = None
        decode_lens = [int(step.query_lens[b]) if b < d else 0 for b in range(num_reqs)]
    schedule = indexer_oracle.mqa_schedule(lens, cfg.num_sms, legacy=False)
    keys = [s // ratio for s in seq]
    query_lens = [int(x) for x in step.query_lens]
    plan = indexer_oracle.prefill_chunk_plan(keys[d:], query_lens[d:], cfg.max_prefill_workspace,
                                             cfg.max_logits_bytes, d)
    chunk_table, cu = [], [0] * (2 * num_reqs)
    key_start = [0] * num_reqs
    for (s, e), (q0, q1) in plan:
        running = 0
        for j, b in enumerate(range(s, e)):
            key_start[b] = running
            cu[2 * s + j] = running
            running += keys[b]
        cu[s + e] = running
        if running:
            chunk_table.append([s, e, qsl[s] + q0, qsl[s] + q1, running, int(q0 > 0), 0, 0])
    chunk_table += [[0] * 8] * (chunk_rows - len(chunk_table))
    ks = [0] * num_tokens
    ke = [0] * num_tokens
    for t in range(td, nt):
        ks[t] = key_start[owner[t]]
        ke[t] = ks[t] + (position[t] + 1) // ratio
    # Every request's query length (0 past the real ones); valid for the decodes, the rest
    # defined; the host knows only the bound.
    per_req = query_lens + [0] * (num_reqs - k)
    positions = [position[t] if t < nt else 0 for t in range(num_tokens)]
    return dict(per_req_decode_lens=per_req, positions=positions, batch_table=padded_table,
                slot_mapping=slots, seq_lens=lens, decode_lens=decode_lens, block_table=blocks,
                schedule=schedule, chunk_bounds=chunk_table, num_chunks=len(
                    [c for c in chunk_table if c[1] > 0]),
                cu_seq_lens=cu, req_key_start=key_start, cu_seqlen_ks=ks, cu_seqlen_ke=ke)


def swa(cfg: ArenaConfig, step, num_reqs: int, num_tokens: int) -> dict:
    """Every output of ``SparseSWAMetadataBuilder.build_mixed`` for a bucket, as a dict of
    lists: per decode-token row lists of ``min(num_tokens, max_decode_tokens)`` rows (SWA
    rows ``sliding_window`` ints, dense rows ``dense_width`` ints, -1 = none),
    dense prefill rows ``num_tokens`` long, per-request lists ``num_reqs`` long."""
    k, nt, d, td = counts(cfg, step)
    W = cfg.sliding_window
    _, owner, position = tokens(step)
    slots = [int(s) for s in step.slot_mapping] + [-1] * (num_tokens - nt)
    valid = [s >= 0 for s in slots]
    live = [t < td and valid[t] for t in range(min(num_tokens, cfg.max_decode_tokens))]
    out = dict(is_valid_token=valid, token_to_req=owner + [0] * (num_tokens - nt),
               c_rows=[], c_lens=[], cp_rows=[], cp_lens=[])
    swa_table = [list(map(int, r)) for r in step.swa_block_table]
    table = [list(map(int, r)) for r in step.block_table]

    def rows_and_lens(key: str, rows: list[tuple[list[int], int]]) -> None:
        out[f"{key}_rows"], out[f"{key}_lens"] = [r for r, _ in rows], [n for _, n in rows]

    rows_and_lens("swa", [swa_oracle.swa_row(cfg, swa_table[owner[t]], position[t]) if x
                          else ([-1] * W, 0) for t, x in enumerate(live)])
    if cfg.dense_layer_type is not None:
        max_c = swa_oracle.dense_width(cfg)
        rows_and_lens("c", [swa_oracle.dense_row(cfg, table[owner[t]], position[t]) if x
                            else ([-1] * max_c, 0) for t, x in enumerate(live)])
        rows_and_lens("cp", [swa_oracle.dense_prefill_row(cfg, position[td + i])
                             if td + i < nt else ([-1] * max_c, 0) for i in range(num_tokens)])
    seq = [int(x) for x in step.seq_lens]
    q = [int(x) for x in step.query_lens]
    out["gather_lens"] = [q[r] + min(seq[r] - q[r], W - 1) for r in range(d, k)]
    out["gather_lens"] += [0] * (num_reqs - (k - d))
    out["prefill_seq_lens"] = seq[d:k] + [0] * (num_reqs - (k - d))
    return out


def assert_indexer_matches(meta, exp: dict, cfg: ArenaConfig, step) -> None:
    """A mixed indexer build equals the oracle everywhere in the bucket's views, compared
    in the order the metadata dataclasses declare the fields (``IndexerMetadata``, its
    prefill plan and its decode part each where they stand), so the first mismatch named is
    the first field that differs."""
    same("slot_mapping", meta.slot_mapping, exp["slot_mapping"])
    plan = meta.prefill.plan
    same("prefill.chunks", meta.prefill.chunks, [])
    same("plan.chunk_bounds", plan.chunk_bounds, exp["chunk_bounds"])
    same("plan.num_chunks", plan.num_chunks, [exp["num_chunks"]])
    for name in ("cu_seq_lens", "req_key_start", "cu_seqlen_ks", "cu_seqlen_ke"):
        same(f"plan.{name}", getattr(plan, name), exp[name])
    d = meta.decode
    if exp["block_table"] is not None:
        same("decode.block_table", d.block_table, exp["block_table"])
    same("decode.seq_lens", d.seq_lens, exp["seq_lens"])
    same("decode.decode_lens", d.decode_lens, exp["decode_lens"])
    holds(not d.requires_padding, "decode.requires_padding False")
    same("decode.schedule_metadata", d.schedule_metadata, exp["schedule"])
    same("decode.per_req_decode_lens", d.per_req_decode_lens, exp["per_req_decode_lens"])
    same("(decode.decode_is_uniform, decode.write_max_decode_len)",
         (d.decode_is_uniform, d.write_max_decode_len), (False, cfg.next_n))
    same("step_counts", meta.step_counts, counts(cfg, step))
    same("positions", meta.positions, exp["positions"])
    k = step.num_reqs
    same("block_table[:k]", meta.block_table[:k], exp["batch_table"][:k])


def assert_swa_matches(meta, exp: dict, cfg: ArenaConfig, step) -> None:
    """A mixed SWA build equals the oracle everywhere in the bucket's views."""
    same("is_valid_token", meta.is_valid_token, exp["is_valid_token"])
    same("token_to_req_indices", meta.token_to_req_indices, exp["token_to_req"])
    same("decode_swa_indices[:, 0]", meta.decode_swa_indices[:, 0], exp["swa_rows"])
    same("decode_swa_lens", meta.decode_swa_lens, exp["swa_lens"])
    if exp["c_rows"]:
        same("dense_decode_indices[:, 0]", meta.dense_decode_indices[:, 0], exp["c_rows"])
        same("dense_decode_lens", meta.dense_decode_lens, exp["c_lens"])
        swa_oracle.assert_dense_chunks(meta.dense_prefill, exp["cp_rows"], exp["cp_lens"])
    same("prefill_gather_lens", meta.prefill_gather_lens, exp["gather_lens"])
    same("prefill_seq_lens", meta.prefill_seq_lens, exp["prefill_seq_lens"])
    same("step_counts", meta.step_counts, counts(cfg, step))
