"""What the indexer builder hands the step: views of arena buffers and static ints (spec §4.2).

The same classes come out of the eager build and the graph-safe decode build, so the step
never needs to know which one ran.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = [
    "IndexerDecodeMetadata",
    "IndexerMetadata",
    "IndexerPrefillChunkMetadata",
    "IndexerPrefillMetadata",
    "IndexerPrefillPlan",
]


@dataclass(slots=True)
class IndexerPrefillChunkMetadata:
    """One prefill chunk (or query sub-chunk) of the indexer.

    Attributes
    ----------
    block_table : int32 ``(num_reqs, max_blocks)``
        Rows ``[start, end)`` of the batch's block table.
    cu_seqlen_ks, cu_seqlen_ke : int32 ``(token_end - token_start,)``
        Per query token: first and one-past-last column of its keys in the gathered K.
        Under decode context parallelism: in this rank's locally gathered K (local row
        bounds), otherwise the global ones.
    cu_seq_lens : int32 ``(num_reqs + 1,)``
        Prefix sums of the requests' compressed lengths (device-exact).
    total_seq_lens : int
        Sum of the host (upper-bound) compressed lengths: rows of K to gather.
    token_start, token_end : int
        Global token range of this (sub-)chunk's queries.
    num_reqs : int
    skip_kv_gather : bool
        True for query sub-chunks after the first: reuse the K gathered before.
    req_start : int
        The chunk's first request (rows ``[req_start, req_start + num_reqs)``).
    local_cu_seq_lens : int32 ``(num_reqs + 1,)`` or None
        Prefix sums of this rank's shares of the compressed lengths (where each request's
        keys land in the locally gathered K); without context parallelism ``cu_seq_lens``.
    local_total_seq_lens : int
        This rank's keys to gather (host upper bound); without DCP ``total_seq_lens``.
    max_local_total_seq_lens : int
        The largest ``local_total_seq_lens`` over the ranks (sizes a workspace every rank
        shares); without DCP ``total_seq_lens``.
    """

    block_table: torch.Tensor
    cu_seqlen_ks: torch.Tensor
    cu_seqlen_ke: torch.Tensor
    cu_seq_lens: torch.Tensor
    total_seq_lens: int
    token_start: int
    token_end: int
    num_reqs: int
    skip_kv_gather: bool
    req_start: int
    local_cu_seq_lens: torch.Tensor | None = None
    local_total_seq_lens: int = 0
    max_local_total_seq_lens: int = 0


@dataclass(slots=True)
class IndexerPrefillPlan:
    """The prefill chunks as planned on the device (the graph-safe mixed build), over the
    static extents of the step (``R`` requests, ``T`` tokens); see
    :mod:`staticattn.kernels.indexer.prefill_plan`.

    Attributes
    ----------
    chunk_bounds : int32 ``(C, 8)``
        Row ``c < num_chunks``: ``[req_start, req_end, token_start, token_end,
        total_seq_lens, skip_kv_gather, local_total_seq_lens, max_local_total_seq_lens]``,
        the fields of one :class:`IndexerPrefillChunkMetadata` (the last two 0 without
        decode context parallelism); rows past ``num_chunks``: zeros.
    num_chunks : int32 ``(1,)``
    cu_seq_lens : int32 ``(2 R,)``
        The chunk over requests ``[s, e)`` reads its key prefix sums at ``[2s, s + e + 1)``;
        entries of no chunk are 0.
    req_key_start : int32 ``(R,)``
        Keys of a prefill request's range before it (its ``cu_seq_lens`` entry); 0 for the
        other requests.
    cu_seqlen_ks, cu_seqlen_ke : int32 ``(T,)``
        By global token: a prefill token's key range in its chunk's gathered K (under DCP
        the rank's locally gathered K); 0, 0 for decode and padded tokens.
    block_table : int32 ``(R, max_blocks)``
        The batch's block table; chunk ``[s, e)`` reads rows ``[s, e)``.
    local_cu_seq_lens, local_req_key_start : int32 ``(2 R,)``, ``(R,)`` or None
        Under decode context parallelism: ``cu_seq_lens`` and ``req_key_start`` of the
        rank's local keys; None without.
    """

    chunk_bounds: torch.Tensor
    num_chunks: torch.Tensor
    cu_seq_lens: torch.Tensor
    req_key_start: torch.Tensor
    cu_seqlen_ks: torch.Tensor
    cu_seqlen_ke: torch.Tensor
    block_table: torch.Tensor
    local_cu_seq_lens: torch.Tensor | None = None
    local_req_key_start: torch.Tensor | None = None


@dataclass(slots=True)
class IndexerPrefillMetadata:
    """The prefill part: ``chunks``, planned on the host (eager builds), or ``plan``, planned
    on the device (mixed builds, inside a graph; ``chunks`` is then empty)."""

    chunks: list[IndexerPrefillChunkMetadata] = field(default_factory=list)
    plan: IndexerPrefillPlan | None = None


@dataclass(slots=True)
class IndexerDecodeMetadata:
    """The decode part.

    Attributes
    ----------
    block_table : int32 ``(rows, max_blocks)``
        Native: the batch's block table rows ``[:num_decodes]``; flatten: the expanded table,
        one row per decode token (padded tokens: all 0, the null block).
    seq_lens : int32 ``(rows, width)``, contiguous
        Per-token visible lengths, compressed when ``R > 1``: ``(D, 1)`` plain decode,
        ``(D, max_decode_len)`` native MTP, ``(Td, 1)`` flatten. Never negative; padding 0.
    decode_lens : int32 ``(rows,)``
        Native: query lengths; flatten: ones.
    requires_padding : bool
        Whether the consumer must pack the queries (native rows of unequal length). Always
        False from the graph-safe build: padded rows are trailing, so the reshape stays right.
    schedule_metadata : int32 ``(num_sms + 1, 2)``
        The paged-MQA-logits schedule of ``seq_lens``.
    global_seq_lens : int32 ``(rows, width)``, contiguous
        Under decode context parallelism: the global per-token lengths, of which ``seq_lens``
        holds this rank's share (``seq_lens`` summed over the ranks). Without it, the same
        view as ``seq_lens``.
    per_req_decode_lens : int32 ``(num_decodes,)`` or None
        Each decode request's query length, whatever the layout (the reference's field of
        the same name: a consumer writing the indexer K groups tokens by request with it).
        From a mixed build it covers the bucket's ``R`` requests: valid for the first
        ``step_counts[2]`` (the decodes); past them the prefills' query lengths, then 0.
        None when the batch carries no device query lengths.
    decode_is_uniform : bool
        Every decode request has the same query length (host value). True from a decode
        graph's build; False from a mixed build, whose lengths are decided per step.
    write_max_decode_len : int
        The longest decode query length (host value); from a graph-safe build its bound,
        ``next_n``.
    """

    block_table: torch.Tensor
    seq_lens: torch.Tensor
    decode_lens: torch.Tensor
    requires_padding: bool
    schedule_metadata: torch.Tensor
    global_seq_lens: torch.Tensor | None = None
    per_req_decode_lens: torch.Tensor | None = None
    decode_is_uniform: bool = True
    write_max_decode_len: int = 1


@dataclass(slots=True)
class IndexerMetadata:
    """Everything the sparse-attention indexer reads for one step.

    Attributes
    ----------
    seq_lens : int32 ``(num_reqs,)``
        The batch's uncompressed sequence lengths.
    max_seq_len : int
    slot_mapping : int64 ``(num_tokens,)``
        Where each token's indexer K goes: the compressed mapping when ``R > 1`` (-1 = no
        write), else the batch's slot mapping; under decode context parallelism this
        rank's slots only (-1 for entries other ranks hold), compressed or not.
    num_decodes, num_decode_tokens, num_prefills, num_prefill_tokens : int
        The split. From a mixed build (any composition, decided on the device) they are the
        capacities of the bucket, upper bounds; the exact values are in ``step_counts``.
    prefill : IndexerPrefillMetadata or None
    decode : IndexerDecodeMetadata or None
    step_counts : int32 device ``(4,)`` or None
        ``[num_reqs, num_tokens, num_decodes, num_decode_tokens]`` of the real step, as the
        staging kernel derived them (decode threshold ``next_n``); the valid regions of a
        mixed build's outputs are bounded by them.
    positions : int64 ``(num_tokens,)`` or None
        Each token's absolute position (0 for padded tokens), as staged.
    block_table : int32 ``(num_reqs, max_blocks_per_req)`` or None
        The batch's block table (main KV group), rows of every request.
    """

    seq_lens: torch.Tensor
    max_seq_len: int
    slot_mapping: torch.Tensor
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    num_prefill_tokens: int
    prefill: IndexerPrefillMetadata | None
    decode: IndexerDecodeMetadata | None
    step_counts: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    block_table: torch.Tensor | None = None
