"""Oracle of the prefill-context-parallel token split and gathered layout
(``prefill-context-parallel.md`` §2, §3.1, §3.2), plain loops over Python ints.

Every rank runs the same code on the same global batch, so each knows every rank's rows:

* **split** (§2.1): a prefilling request of ``q`` tokens is cut into ``K = 2P`` chunks of
  ``c = cdiv(q, K)``; rank ``p`` takes chunks ``p`` and ``K-1-p`` (empty ones skipped). A
  decode is never split: under D = 1 its one owner is ``ordinal % P`` (ordinal counts the
  decodes with ``q > 0``), under D > 1 every rank holds it whole, and so is a prefill too
  short for ``K`` full chunks (``(K-1) c >= q``).
* **order** (§2.2): non-prefilling rows first, then prefill rows, each in global order.
* **layout** (§2.3): rank ``p``'s local token ``j`` is gathered index ``p N + j``. Worked
  example (P=2, D=1, fresh prefills q = (37, 100)): rank 0 holds A[0,10) A[30,37) B[0,25)
  B[75,100) (67 tokens), rank 1 A[10,20) A[20,30) B[25,50) B[50,75) (70), so N = 70 and
  ``padded_gather_idx`` is ``0..9, 30..36, 37..61, 112..136, 0,0,0`` then ``10..29, 62..111``.
* **slots** (§3.2): the global slot of each token under this rank's DCP rank, kept only at
  the canonical copy of the gathered layout, PAD (-1) elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from staticattn.arena.pcp_config import PCPConfig

__all__ = ["GlobalBatch", "Layout", "Row", "dcp_local_seq_len", "gathered_slots", "layout",
           "rank_metadata", "rank_rows", "token_slot"]

PAD = -1


@dataclass
class GlobalBatch:
    """The step every rank is handed, as host lists (one entry per request, global order).

    query_lens : q_i, scheduled tokens; num_computed : C_i; is_prefilling : pre_i;
    req_state_idx : the request-state index; block_table : each request's block row.
    """

    query_lens: list[int]
    num_computed: list[int]
    is_prefilling: list[bool]
    req_state_idx: list[int]
    block_table: list[list[int]]

    @property
    def query_start_loc(self) -> list[int]:
        qsl = [0]
        for q in self.query_lens:
            qsl.append(qsl[-1] + q)
        return qsl


@dataclass(frozen=True)
class Row:
    """One rank-local request segment: query offsets ``[offset, offset + length)`` of
    request ``req``; ``replicated``: a whole unsplit request (under D > 1 on every rank)."""

    req: int
    offset: int
    length: int
    replicated: bool


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _replicated(cfg: PCPConfig, q: int, prefilling: bool) -> bool:
    if not prefilling:
        return True
    # Under DCP a prefill that would leave chunk K-1 empty stays whole on every rank, so each
    # rank's chunk plan charges it the same query tokens.
    return cfg.dcp_size > 1 and (cfg.num_chunks - 1) * _cdiv(q, cfg.num_chunks) >= q


def rank_rows(cfg: PCPConfig, batch: GlobalBatch, rank: int) -> list[Row]:
    """The rows of ``rank``, in the §2.2 order; a rank with none gets the placeholder, one
    row of 0 tokens of request 0."""
    K = cfg.num_chunks
    decode_rows, prefill_rows = [], []
    ordinal = 0
    for i, q in enumerate(batch.query_lens):
        if q == 0:
            continue
        rows = decode_rows if not batch.is_prefilling[i] else prefill_rows
        if _replicated(cfg, q, batch.is_prefilling[i]):
            if cfg.dcp_size > 1 or ordinal % cfg.pcp_size == rank:
                rows.append(Row(i, 0, q, True))
            ordinal += 1
            continue
        c = _cdiv(q, K)
        for chunk in (rank, K - 1 - rank):
            start, end = chunk * c, min((chunk + 1) * c, q)
            if start < end:
                rows.append(Row(i, start, end - start, False))
    return decode_rows + prefill_rows or [Row(0, 0, 0, False)]


@dataclass
class Layout:
    """Every rank's rows and the three gathered index arrays of §2.3.

    rows[p] : rank p's rows; num_tokens[p] : N_p; N : the common padded length;
    padded_gather_idx, write_mask : ``P N`` entries; hidden_restore_idx : one per global
    token, the gathered index of its canonical copy.
    """

    rows: list[list[Row]]
    num_tokens: list[int]
    N: int
    padded_gather_idx: list[int]
    write_mask: list[bool]
    hidden_restore_idx: list[int]


def layout(cfg: PCPConfig, batch: GlobalBatch, N: int | None = None) -> Layout:
    """The gathered layout; ``N`` the chosen padded length (None: ``max_p N_p``).

    Raises ``ValueError`` when ``N`` is below the largest rank's token count.
    """
    P, qsl = cfg.pcp_size, batch.query_start_loc
    rows = [rank_rows(cfg, batch, p) for p in range(P)]
    num_tokens = [sum(r.length for r in rs) for rs in rows]
    if N is None:
        N = max(num_tokens)
    if N < max(num_tokens):
        raise ValueError(f"PCP padded token count {N} is smaller than the largest rank-local "
                         f"batch {max(num_tokens)}")
    gather, mask = [0] * (P * N), [False] * (P * N)
    restore = [0] * qsl[-1]
    for p in range(P):
        k = p * N
        for row in rows[p]:
            canonical = not (row.replicated and cfg.dcp_size > 1 and p != 0)
            for j in range(row.length):
                g = qsl[row.req] + row.offset + j
                gather[k], mask[k] = g, canonical
                if canonical:
                    restore[g] = k
                k += 1
    return Layout(rows, num_tokens, N, gather, mask, restore)


def token_slot(cfg: PCPConfig, block_row, position: int, dcp_rank: int) -> int:
    """The slot of the token at ``position`` on DCP rank ``dcp_rank`` (§3.2), PAD when
    another DCP rank holds it."""
    bs, D, interleave = cfg.block_size, cfg.dcp_size, cfg.cp_kv_cache_interleave_size
    if D == 1:
        return block_row[position // bs] * bs + position % bs
    vo = position % (bs * D)
    if (vo // interleave) % D != dcp_rank:
        return PAD
    local = (vo // (interleave * D)) * interleave + vo % interleave
    return block_row[position // (bs * D)] * bs + local


def gathered_slots(cfg: PCPConfig, batch: GlobalBatch, lay: Layout, dcp_rank: int = 0
                   ) -> list[int]:
    """The gathered slot mapping (``P N`` entries) as DCP rank ``dcp_rank`` writes it."""
    req_of, pos_of = [], []
    for i, q in enumerate(batch.query_lens):
        for j in range(q):
            req_of.append(i)
            pos_of.append(batch.num_computed[i] + j)
    out = []
    for g, canonical in zip(lay.padded_gather_idx, lay.write_mask):
        i = req_of[g] if canonical else 0
        out.append(token_slot(cfg, batch.block_table[i], pos_of[g], dcp_rank) if canonical
                   else PAD)
    return out


def dcp_local_seq_len(length: int, world: int, rank: int, interleave: int) -> int:
    """Tokens among the first ``length`` that DCP rank ``rank`` holds, counted one by one."""
    return sum(1 for x in range(length) if (x // interleave) % world == rank)


def rank_metadata(cfg: PCPConfig, batch: GlobalBatch, lay: Layout, rank: int,
                  dcp_rank: int = 0) -> dict[str, list]:
    """Rank ``rank``'s per-row metadata (§3.1) and local tokens: ``query_start_loc``,
    ``start_pos`` (= ``num_computed_tokens``), ``seq_lens``, ``seq_lens_upper``, ``req_idx``,
    ``is_prefilling``, ``global_query_lens``, ``global_seq_lens_upper``,
    ``dcp_local_seq_lens``, ``dcp_local_seq_lens_upper`` (one per row) and ``positions``,
    ``token_to_global`` (the rank's ``N`` local tokens, 0 past ``N_p``)."""
    D, interleave = cfg.dcp_size, cfg.cp_kv_cache_interleave_size
    out: dict[str, list] = {k: [] for k in (
        "query_start_loc", "start_pos", "seq_lens", "seq_lens_upper", "req_idx",
        "is_prefilling", "global_query_lens", "global_seq_lens_upper", "dcp_local_seq_lens",
        "dcp_local_seq_lens_upper", "positions", "token_to_global")}
    out["query_start_loc"].append(0)
    for row in lay.rows[rank]:
        i = row.req
        start = batch.num_computed[i] + row.offset
        # The placeholder row (0 tokens) has seq_len 0 on the device, its context as bound.
        seq_len = start + row.length if row.length else 0
        total = batch.num_computed[i] + batch.query_lens[i]
        out["query_start_loc"].append(out["query_start_loc"][-1] + row.length)
        out["start_pos"].append(start)
        out["seq_lens"].append(seq_len)
        out["seq_lens_upper"].append(start + row.length)
        out["req_idx"].append(batch.req_state_idx[i])
        out["is_prefilling"].append(batch.is_prefilling[i])
        out["global_query_lens"].append(batch.query_lens[i])
        out["global_seq_lens_upper"].append(total)
        out["dcp_local_seq_lens"].append(dcp_local_seq_len(seq_len, D, dcp_rank, interleave))
        out["dcp_local_seq_lens_upper"].append(dcp_local_seq_len(total, D, 0, interleave))
        out["positions"] += range(start, start + row.length)
    segment = lay.padded_gather_idx[rank * lay.N:(rank + 1) * lay.N]
    n = lay.num_tokens[rank]
    out["token_to_global"] = segment[:n] + [0] * (lay.N - n)
    out["positions"] += [0] * (lay.N - n)
    return out
