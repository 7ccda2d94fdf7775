"""The checks of a prefill-context-parallel step, on the host, before anything is written
(``prefill-context-parallel.md`` §2.3, §6's runtime errors).

Every rank runs the same checks on the same global host arrays, so every rank raises the same
typed error or none does. What the step needs of the fixed buffers is counted here with a
few vectorized numpy reductions, the way the device split counts it (§2.1): a prefilling
request of ``q`` tokens gives rank ``p`` its non-empty chunks ``p`` and ``2P-1-p`` of
``c = cdiv(q, 2P)``; a decode (and under DCP a prefill with ``(2P-1) c >= q``) stays whole,
on its one owner ``ordinal % P`` (D = 1) or on every rank (D > 1).

* :class:`~staticattn.errors.InvalidBatchError`: arrays of the wrong rank, dtype or length,
  negative lengths, decreasing query starts;
* :class:`~staticattn.errors.CapacityError`: more requests than ``max_num_seqs`` (a rank's
  rows, two a request, then exceed ``2 * max_num_seqs``), more tokens than the global
  capacity, a rank's tokens above ``max_num_batched_tokens``, a padded length ``N`` (the
  bucket) below the largest rank's tokens or above the per-rank capacity, a prefill whose KV
  extent does not fit the prefill workspace.
"""

from __future__ import annotations

import numpy as np

from staticattn.arena.pcp_config import PCPConfig
from staticattn.errors import CapacityError, InvalidBatchError
from staticattn.validation.values import check_non_decreasing, check_non_negative, host_ints

__all__ = ["check_pcp_requests", "check_pcp_step", "rank_token_counts"]


def _dcp_shard(n: np.ndarray, world: int, interleave: int) -> np.ndarray:
    """DCP rank 0's share of the first ``n`` tokens (the largest shard)."""
    base = n // (interleave * world) * interleave
    return base + np.minimum(np.maximum(n - base * world, 0), interleave)


def rank_token_counts(cfg: PCPConfig, query_lens: np.ndarray, is_prefilling: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Each rank's rows and tokens, int64 ``(P,)`` each (the zero-token placeholder row is
    not counted: it needs no buffer)."""
    P, K = cfg.pcp_size, cfg.num_chunks
    q = query_lens
    c = -(-q // K)
    # Chunk j of a split request holds min(max(q - j c, 0), c) tokens, (K, S); rank p computes
    # chunks p and K-1-p. All K at once and np.minimum/np.maximum (np.clip is several times
    # slower on arrays this small): this runs on the host before every step.
    chunk = np.minimum(np.maximum(q - np.arange(K)[:, None] * c, 0), c)
    first, second = chunk[:P], chunk[K - 1:P - 1:-1]
    replicated = ~is_prefilling
    if cfg.dcp_size > 1:
        replicated = replicated | ((K - 1) * c >= q)
    replicated &= q > 0
    if cfg.dcp_size == 1:
        ordinal = np.cumsum(replicated) - replicated
        held = replicated & (ordinal % P == np.arange(P)[:, None])
    else:
        held = np.broadcast_to(replicated, (P, q.size))
    rows = np.where(replicated, held, (first > 0).astype(np.int64) + (second > 0))
    tokens = np.where(replicated, held * q, first + second)
    return rows.sum(1), tokens.sum(1)


def check_pcp_step(cfg: PCPConfig, query_start_loc, is_prefilling, num_computed, *,
                   num_tokens_padded: int, max_num_batched_tokens: int, max_num_tokens: int,
                   prefill_workspace: int | None = None) -> np.ndarray:
    """Raise a typed error unless the step fits every PCP buffer; return each rank's token
    count ``N_p`` (int64 ``(P,)``).

    Parameters
    ----------
    cfg : PCPConfig
    query_start_loc : host ints ``(S + 1,)``; is_prefilling : host bools ``(S,)``;
    num_computed : host ints ``(S,)``
        The global step's real requests (host copies: reading device values would sync).
    num_tokens_padded : int
        ``N``, the bucket every rank pads to; it must hold the largest rank's tokens.
    max_num_batched_tokens : int
        The tokens a rank's buffers hold (``N`` may not exceed it).
    max_num_tokens : int
        The global tokens the restore index holds.
    prefill_workspace : int, optional
        The indexer's prefill workspace in entries: every prefill request's extent (its
        length ``L``, or under DCP ``D`` times its largest shard) must fit it alone.
    """
    qsl = host_ints("query_start_loc", query_start_loc, ndim=1)
    computed = host_ints("num_computed", num_computed, ndim=1)
    pre = np.asarray(is_prefilling)
    if pre.ndim != 1 or (pre.size and pre.dtype != np.bool_):
        raise InvalidBatchError(f"is_prefilling must be 1-D bools, got {pre.dtype} "
                                f"of shape {pre.shape}")
    S = computed.size
    if qsl.size != S + 1 or pre.size != S:
        raise InvalidBatchError(f"query_start_loc has {qsl.size} entries, is_prefilling "
                                f"{pre.size} and num_computed {S}; they must be S + 1, S, S")
    if qsl.size and qsl[0] != 0:
        raise InvalidBatchError(f"query_start_loc[0]={int(qsl[0])}; it must be 0")
    check_non_negative("num_computed", computed)
    q = check_non_decreasing("query_start_loc", qsl)
    if S > cfg.max_num_seqs:
        raise CapacityError(f"num_reqs={S} exceeds max_num_seqs={cfg.max_num_seqs} (a rank "
                            f"holds at most {cfg.max_rows} rows, two a request)")
    if qsl[-1] > max_num_tokens:
        raise CapacityError(f"num_tokens={int(qsl[-1])} exceeds the global token capacity "
                            f"{max_num_tokens}")
    rows, tokens = rank_token_counts(cfg, q, pre)
    if rows.max(initial=0) > cfg.max_rows:  # unreachable past the request check; kept exact
        raise CapacityError(f"a rank holds {int(rows.max())} rows; the buffers hold "
                            f"{cfg.max_rows}")
    busiest = int(np.argmax(tokens))
    if tokens[busiest] > max_num_batched_tokens:
        raise CapacityError(f"PCP rank {busiest} holds {int(tokens[busiest])} tokens; its "
                            f"buffers hold max_num_batched_tokens={max_num_batched_tokens}")
    if num_tokens_padded > max_num_batched_tokens:
        raise CapacityError(f"PCP padded token count {num_tokens_padded} exceeds "
                            f"max_num_batched_tokens={max_num_batched_tokens}")
    if num_tokens_padded < tokens[busiest]:
        raise CapacityError(f"PCP padded token count {num_tokens_padded} is smaller than the "
                            f"largest rank-local batch ({int(tokens[busiest])} tokens on rank "
                            f"{busiest})")
    if prefill_workspace is not None:
        total = computed + q
        extent = total if cfg.dcp_size == 1 else cfg.dcp_size * _dcp_shard(
            total, cfg.dcp_size, cfg.cp_kv_cache_interleave_size)
        extent = np.where(pre & (q > 0), extent, 0)
        if extent.max(initial=0) > prefill_workspace:
            i = int(np.argmax(extent))
            raise CapacityError(f"prefill request {i} needs {int(extent[i])} workspace "
                                f"entries; the prefill workspace holds {prefill_workspace}")
    return tokens


def check_pcp_requests(query_lens: np.ndarray, is_prefilling: np.ndarray,
                       num_computed: np.ndarray, *, decode_threshold: int,
                       max_model_len: int) -> None:
    """What a rank's builders need of the global requests beyond :func:`check_pcp_step`:
    a request that is not prefilling is a decode row of at most ``decode_threshold`` tokens
    (its rows come first and are built as decodes, §3.1), and no request runs past
    ``max_model_len``. Host int64 ``query_lens`` and ``num_computed``, bool
    ``is_prefilling``, all ``(S,)``; :class:`InvalidBatchError` / :class:`CapacityError`."""
    long_decode = ~is_prefilling & (query_lens > decode_threshold)
    if long_decode.any():
        i = int(np.argmax(long_decode))
        raise InvalidBatchError(f"request {i} is not prefilling but schedules "
                                f"{int(query_lens[i])} tokens; a decode row holds at most "
                                f"decode_threshold={decode_threshold}")
    total = num_computed + query_lens
    if total.max(initial=0) > max_model_len:
        i = int(np.argmax(total))
        raise CapacityError(f"request {i} reaches {int(total[i])} tokens; max_model_len="
                            f"{max_model_len}")
