"""Oracle of the indexer metadata, written as plain loops from the spec's words
(vllm-semantics.md §3.2, §4.5-§4.9; deepgemm-flashmla.md §1.2), with staticattn's documented
deviations: lengths clamped at 0, padded flatten rows of the expanded block table all 0.

Everything works on Python ints and lists; nothing here calls staticattn's kernels.
"""

from __future__ import annotations

from itertools import accumulate

from staticattn.reference.assertions import holds, same

__all__ = ["SPLIT_KV", "assert_matches", "cdiv", "compressed_slot_mapping", "decode_part",
           "decode_values", "indexer_metadata", "mqa_schedule", "prefill_chunk",
           "prefill_chunk_plan", "split_decodes_and_prefills"]


SPLIT_KV = 256


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints."""
    return -(-a // b)


def split_decodes_and_prefills(query_lens, max_query_len, num_tokens, threshold,
                               require_uniform):
    """§3.2 with short extends counted as decodes: (D, P, Td, Tp)."""
    r = len(query_lens)
    everything = (r, 0, num_tokens, 0)
    if max_query_len <= threshold and (not require_uniform or threshold <= 1):
        return everything
    if query_lens[0] > threshold:
        return 0, r, 0, num_tokens
    if require_uniform:
        if all(q == query_lens[0] or q == 0 for q in query_lens):
            return everything
        is_prefill = [q != query_lens[0] for q in query_lens]
    else:
        is_prefill = [q > threshold for q in query_lens]
    if not any(is_prefill):
        return everything
    first = is_prefill.index(True)
    td = sum(query_lens[:first])
    return first, r - first, td, num_tokens - td


def compressed_slot_mapping(qsl, seq_lens, block_table, storage_block_size, ratio, num_tokens):
    """§4.5: the token completing a group of R positions writes compressed index p // R.

    ``qsl``: ``R + 1`` query starts; ``seq_lens``: ``R`` ints; ``block_table``: ``R`` rows
    of block ids. Returns ``num_tokens`` ints (-1 = no write)."""
    out = [-1] * num_tokens
    for b in range(len(seq_lens)):
        q = qsl[b + 1] - qsl[b]
        for j in range(q):
            p = seq_lens[b] - q + j
            if (p + 1) % ratio == 0:
                k = p // ratio
                block = block_table[b][k // storage_block_size]
                out[qsl[b] + j] = block * storage_block_size + k % storage_block_size
    return out


def mqa_schedule(context_lens, num_sms, legacy):
    """deepgemm-flashmla.md §1.2 (v2.6.1), or §4.9's older remainder rule when ``legacy``.

    ``context_lens``: rows (requests or flattened tokens) of ``next_n`` ints. Returns
    ``num_sms + 1`` rows ``[atom index, split index]``; no rows at all give every SM the
    end sentinel ``[0, 0]``."""
    if not context_lens:
        return [[0, 0]] * (num_sms + 1)
    batch, next_n = len(context_lens), len(context_lens[0])
    prefix = list(accumulate(cdiv(row[next_n - 1], SPLIT_KV) for row in context_lens))
    atom = 2 if next_n >= 2 else 1
    atoms = cdiv(next_n, atom)
    total = prefix[-1] * atoms
    q, r = divmod(total, num_sms)
    rows = []
    for i in range(num_sms):
        u = i * q + (min(i, r) if legacy else max(0, i - (num_sms - r)))
        b = batch
        for cand in range(batch):
            if atoms * prefix[cand] > u:
                b = cand
                break
        if b == batch:
            rows.append([batch * atoms, 0])
            continue
        before = prefix[b - 1] if b > 0 else 0
        off = u - atoms * before
        nb = prefix[b] - before
        rows.append([b * atoms + off // nb, off % nb] if nb else [b * atoms, 0])
    rows.append([batch * atoms, 0])
    return rows


def decode_part(config, qsl, seq_lens, block_table, num_decodes, num_decode_tokens, graph,
                legacy=False):
    """§4.8: the decode layout and its tensors; ``graph`` = the static capture layout."""
    n, ratio = config.next_n, config.index_compress_ratio
    flat_cfg = config.use_flattening and n > 1
    dl = [qsl[b + 1] - qsl[b] for b in range(num_decodes)]
    if graph:
        flatten, width, requires_padding = flat_cfg, n, False
    else:
        flatten = config.use_flattening and max(dl) > 1
        width = max(max(dl), 1)
        requires_padding = not flatten and min(dl) != max(dl)
    width_cols = len(block_table[0]) if block_table else config.max_blocks_per_req
    if flatten:
        real = qsl[num_decodes]
        lens, table = [], []
        for t in range(num_decode_tokens):
            owner = next((b for b in range(num_decodes) if qsl[b] <= t < qsl[b + 1]), None)
            if t < real and owner is not None:
                j = t - qsl[owner]
                lens.append([(seq_lens[owner] - dl[owner] + j + 1) // ratio])
                table.append(list(block_table[owner]))
            else:
                lens.append([0])
                table.append([0] * width_cols)
        decode_lens = [1] * num_decode_tokens
    else:
        lens = [[max(seq_lens[b] - width + 1 + j, 0) // ratio for j in range(width)]
                for b in range(num_decodes)]
        decode_lens, table = dl, None
    # The reference's per-request fields (vllm-0.33-delta §1.2 item 3): query lengths of
    # the decode requests, whether they are all equal and the longest; a static build knows
    # only its shape: uniform, next_n.
    return dict(
        flatten=flatten, seq_lens=lens, decode_lens=decode_lens, block_table=table,
        requires_padding=requires_padding,
        schedule=mqa_schedule(lens, config.num_sms, legacy),
        per_req_decode_lens=dl, decode_is_uniform=True if graph else min(dl) == max(dl),
        write_max_decode_len=n if graph else max(dl),
    )


def prefill_chunk_plan(keys, query_lens, workspace, max_logits_bytes, offset):
    """§4.6: greedy request chunks, then query sub-chunks of at most E // N tokens."""
    budget = max_logits_bytes // 4
    plan, end = [], 0
    while end < len(keys):
        start, m, nk = end, 0, 0
        while end < len(keys):
            if nk + keys[end] <= workspace and (m + query_lens[end]) * (nk + keys[end]) <= budget:
                m, nk = m + query_lens[end], nk + keys[end]
                end += 1
            else:
                break
        if end == start:
            m, nk = query_lens[end], keys[end]
            end += 1
        max_q = max(1, budget // nk) if nk > 0 else m
        q0 = 0
        while q0 < m:
            plan.append(((start + offset, end + offset), (q0, q0 + min(max_q, m - q0))))
            q0 += max_q
    return plan


def prefill_chunk(qsl, seq_lens, ratio, start, end, q0=None, q1=None):
    """§4.7: one chunk's prefix sums, per-token key ranges and host ints (None if empty)."""
    keys = [seq_lens[b] // ratio for b in range(start, end)]
    total = sum(keys)
    if total == 0:
        return None
    cu = [0, *accumulate(keys)]
    q0 = 0 if q0 is None else q0
    q1 = qsl[end] - qsl[start] if q1 is None else q1
    ks, ke = [], []
    for r, b in enumerate(range(start, end)):
        q = qsl[b + 1] - qsl[b]
        for o in range(q):
            if q0 <= qsl[b] + o - qsl[start] < q1:
                ks.append(cu[r])
                ke.append(cu[r] + (seq_lens[b] - q + 1 + o) // ratio)
    return dict(
        cu_seq_lens=cu, total_seq_lens=total, cu_seqlen_ks=ks, cu_seqlen_ke=ke,
        token_start=qsl[start] + q0, token_end=qsl[start] + q1, num_reqs=end - start,
        skip_kv_gather=q0 > 0, requests=(start, end),
    )


def indexer_metadata(config, step, *, graph=False, legacy=False):
    """Every field of the builder's output for a staged step (padded extents).

    Parameters
    ----------
    config : ArenaConfig
    step : HostStep
        The step as the host knows it; ``R = step.num_reqs_padded`` requests and
        ``T = step.num_tokens_padded`` tokens after padding.
    graph : bool
        The static uniform decode build of ``R`` requests (``build_decode``), not ``build``.
    legacy : bool
        The paged-MQA schedule's older remainder rule (spec §4.9).

    Returns
    -------
    dict
        ``num_decodes``, ``num_prefills``, ``num_decode_tokens``, ``num_prefill_tokens``
        (ints); ``slot_mapping`` (``T`` ints, -1 = no write; None under DCP: per rank,
        :mod:`staticattn.reference.dcp_indexer`); ``positions`` (``T`` ints); ``block_table``
        (``R`` rows of ``max_blocks_per_req`` ints); ``decode`` (None without decodes, else
        :func:`decode_part`'s dict: ``seq_lens`` rows of per-token lengths, ``decode_lens``,
        ``block_table``, ``schedule`` (``num_sms + 1`` rows of two ints) ...); ``prefill``
        (None without prefills, else a list of :func:`prefill_chunk` dicts).
    """
    n, ratio = config.next_n, config.index_compress_ratio
    qsl = step.query_start_loc
    seq_lens = step.padded_seq_lens()
    r, nt = step.num_reqs_padded, step.num_tokens_padded
    real_rows = [list(map(int, row)) for row in step.block_table]
    table = real_rows + [[0] * config.max_blocks_per_req] * (r - step.num_reqs)
    query_lens = [qsl[b + 1] - qsl[b] for b in range(r)]
    if graph:
        d, p, td, tp = r, 0, r * n, 0
    else:
        max_q = max(int(q) for q in step.query_lens)
        d, p, td, tp = split_decodes_and_prefills(
            query_lens, max_q, nt, n, require_uniform=not config.use_flattening
        )
    if config.dcp_world_size > 1:
        slots = None  # each rank's own: staticattn.reference.dcp_indexer
    elif ratio > 1:
        slots = compressed_slot_mapping(qsl, seq_lens, table, config.storage_block_size,
                                        ratio, nt)
    else:
        slots = [int(s) for s in step.slot_mapping] + [-1] * (nt - step.num_tokens)
    decode = decode_part(config, qsl, seq_lens, table, d, td, graph, legacy) if d else None
    prefill = None
    if p:
        keys = [seq_lens[b] // ratio for b in range(d, d + p)]
        plan = prefill_chunk_plan(keys, query_lens[d:], config.max_prefill_workspace,
                                  config.max_logits_bytes, d)
        prefill = []
        for (s, e), (q0, q1) in plan:
            chunk = prefill_chunk(qsl, seq_lens, ratio, s, e, q0, q1)
            if chunk is not None:
                prefill.append(chunk)
    positions = []
    for b in range(r):
        positions += [seq_lens[b] - query_lens[b] + j for j in range(query_lens[b])]
    positions += [0] * (nt - len(positions))
    return dict(num_decodes=d, num_prefills=p, num_decode_tokens=td, num_prefill_tokens=tp,
                slot_mapping=slots, decode=decode, prefill=prefill, positions=positions,
                block_table=table)


def assert_matches(meta, expected, step, arena) -> None:
    """Every field of ``meta`` (an ``IndexerMetadata``) equals ``expected`` in its valid
    region, every tensor is a view of the arena, and the decode lengths are contiguous.

    Fields are compared in the order the metadata dataclasses declare them
    (``IndexerMetadata``, its prefill chunks and its decode part each where they stand), so
    the first mismatch named is the first field that differs."""
    device_block = arena.block("device").untyped_storage().data_ptr()
    same("slot_mapping", meta.slot_mapping, expected["slot_mapping"])
    holds(meta.slot_mapping.untyped_storage().data_ptr() == device_block,
          "slot_mapping a view of the arena")
    for name in ("num_decodes", "num_decode_tokens", "num_prefills", "num_prefill_tokens"):
        same(name, getattr(meta, name), expected[name])
    want_chunks = expected["prefill"]
    if want_chunks is None:
        holds(meta.prefill is None, "no prefill metadata")
    else:
        same("len(prefill.chunks)", len(meta.prefill.chunks), len(want_chunks))
        for chunk, w in zip(meta.prefill.chunks, want_chunks):
            s, e = w["requests"]
            rows = chunk.block_table[: max(0, min(e, step.num_reqs) - s)].tolist()
            same("prefill chunk block_table", rows,
                 [list(map(int, r)) for r in step.block_table[s : s + len(rows)]])
            for name in ("cu_seqlen_ks", "cu_seqlen_ke", "cu_seq_lens"):
                same(f"prefill chunk {name}", getattr(chunk, name), w[name])
                holds(getattr(chunk, name).untyped_storage().data_ptr() == device_block,
                      f"prefill chunk {name} a view of the arena")
            for name in ("total_seq_lens", "token_start", "token_end", "num_reqs",
                         "skip_kv_gather"):
                same(f"prefill chunk {name}", getattr(chunk, name), w[name])
    want = expected["decode"]
    if want is None:
        holds(meta.decode is None, "no decode metadata")
    else:
        got = meta.decode
        if want["flatten"]:
            same("decode.block_table", got.block_table, want["block_table"])
        else:
            rows = got.block_table[: step.num_reqs].tolist()
            same("decode.block_table", rows,
                 [list(map(int, r)) for r in step.block_table[: len(rows)]])
        same("decode.seq_lens", got.seq_lens, want["seq_lens"])
        holds(got.seq_lens.is_contiguous(), "decode.seq_lens contiguous")
        for name in ("decode_lens", "requires_padding"):
            same(f"decode.{name}", getattr(got, name), want[name])
        same("decode.schedule_metadata", got.schedule_metadata, want["schedule"])
        for name in ("per_req_decode_lens", "decode_is_uniform", "write_max_decode_len"):
            same(f"decode.{name}", getattr(got, name), want[name])
        for t in (got.seq_lens, got.decode_lens, got.block_table, got.schedule_metadata):
            holds(t.untyped_storage().data_ptr() == device_block,
                  "every decode tensor a view of the arena")
    same("positions", meta.positions, expected["positions"])
    rows = meta.block_table[: step.num_reqs].tolist()
    same("block_table", rows, expected["block_table"][: step.num_reqs])


def decode_values(meta) -> tuple:
    """The decode step's outputs as host lists, to compare two builds of one step."""
    d = meta.decode
    return (meta.slot_mapping.tolist(), d.seq_lens.tolist(), d.decode_lens.tolist(),
            d.block_table.tolist(), d.schedule_metadata.tolist())
