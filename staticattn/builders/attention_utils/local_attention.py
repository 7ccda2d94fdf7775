"""Chunked local attention as a batch of virtual requests (vLLM v0.14's
``make_local_attention_virtual_batches``).

With local attention of chunk size ``A`` a token at position ``p`` sees only the keys of its
own chunk, ``[A * (p // A), p]``. Cutting every request at chunk boundaries turns this into
ordinary causal attention over "virtual" requests: one per (request, chunk touched by its
queries), whose keys are the chunk's keys up to the request's end.

Eager planning from host lengths; it allocates its outputs (as the reference does) and is
not meant for a captured step.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from staticattn.builders.batch import Batch
from staticattn.errors import ConfigError, InvalidBatchError

__all__ = ["make_local_attention_virtual_batches"]


def make_local_attention_virtual_batches(
    attn_chunk_size: int, batch: Batch, block_size: int
) -> tuple[Batch, Callable[[torch.Tensor], torch.Tensor]]:
    """Split every request of ``batch`` into virtual requests, one per local-attention chunk
    its queries touch.

    Parameters
    ----------
    attn_chunk_size : int
        Local attention chunk ``A``; a multiple of ``block_size``.
    batch : Batch
        Reads ``query_start_loc_cpu`` (int32 host ``(R + 1,)``), ``seq_lens_cpu`` (int32
        host ``(R,)``), ``block_table`` (int32 ``(R, C)``), ``num_actual_tokens``,
        ``slot_mapping`` and ``positions``.
    block_size : int
        Tokens per KV block of ``block_table``.

    Returns
    -------
    virtual : Batch
        ``V`` virtual requests, in request then chunk order: ``query_start_loc(_cpu)`` int32
        ``(V + 1,)``, ``seq_lens(_cpu)`` int32 ``(V,)`` (keys of the chunk up to the request's
        end), ``block_table`` int32 ``(V, A // block_size)`` (the chunk's blocks), the parent's
        ``num_actual_tokens``, ``slot_mapping`` and ``positions`` (the tokens are the same),
        ``max_query_len`` / ``max_seq_len`` over the virtual requests. ``token_to_req`` is
        None (it would name virtual requests; nothing here computes it).
    make_block_table : callable
        ``make_block_table(block_table)`` -> int32 ``(V, A // block_size)``: the gather that
        produced ``virtual.block_table``, for an updated parent table of the same shape.

    Raises
    ------
    ConfigError
        ``attn_chunk_size`` or ``block_size`` not positive, or the chunk not a whole number
        of blocks.
    InvalidBatchError
        A query longer than its sequence.

    Notes
    -----
    Differences from vLLM v0.14's version (the function is not in spec §2-§4): a graph-padding
    row (query length 0, sequence length 0) becomes one virtual request with query and key
    length 0 whose block row is column 0 of its table row, where v0.14 computes a key
    length of ``A`` and a negative start block that wraps to the end of the row. Block
    columns past the table are clamped to its last column (as v0.14 does) and never below
    column 0. The index tensors of the gather are moved to the table's device once, so the
    gather does not copy them per call.

    Examples
    --------
    ``A = 4``, query lengths ``[4, 10, 5]``, sequence lengths ``[6, 17, 9]``, block size 2,
    ``block_table[b] = [10 b, ..., 10 b + 9]``: the first chunk of each request holds
    ``[2, 1, 4]`` of its queries and the requests touch ``[2, 4, 2]`` chunks, so

    * query lengths ``[2, 2, 1, 4, 4, 1, 4, 1]``, ``query_start_loc
      [0, 2, 4, 5, 9, 13, 14, 18, 19]``;
    * key lengths ``[4, 2, 4, 4, 4, 1, 4, 1]``; chunks start at keys
      ``[0, 4, 4, 8, 12, 16, 4, 8]``;
    * block rows ``[0, 1] [2, 3] [12, 13] [14, 15] [16, 17] [18, 19] [22, 23] [24, 25]``.
    """
    if attn_chunk_size < 1 or block_size < 1:
        raise ConfigError(
            f"attn_chunk_size={attn_chunk_size} and block_size={block_size} must be positive"
        )
    if attn_chunk_size % block_size:
        raise ConfigError(
            f"attn_chunk_size={attn_chunk_size} is not a multiple of block_size={block_size}"
        )
    chunk = attn_chunk_size
    num_reqs = batch.num_reqs
    qsl = batch.query_start_loc_cpu.numpy()[: num_reqs + 1].astype(np.int64)
    seq_lens = batch.seq_lens_cpu.numpy()[:num_reqs].astype(np.int64)
    query_lens = np.diff(qsl)
    context = seq_lens - query_lens
    if (context < 0).any():
        b = int(np.argmax(context < 0))
        raise InvalidBatchError(
            f"request {b} schedules {int(query_lens[b])} tokens, more than its sequence "
            f"length {int(seq_lens[b])}"
        )
    # The first chunk may already hold context: only its remaining room takes queries.
    # e.g. context [2, 7, 4], A 4 -> room [2, 1, 4] -> first-chunk queries [2, 1, 4].
    first_queries = np.minimum(chunk - context % chunk, query_lens)
    num_chunks = 1 + -(-(query_lens - first_queries) // chunk)
    # Keys of a request's last chunk: 1..A, or 0 for an empty (padding) row.
    last_keys = np.where(seq_lens > 0, seq_lens - (seq_lens - 1) // chunk * chunk, 0)

    num_virtual = int(num_chunks.sum())
    owner = np.repeat(np.arange(num_reqs), num_chunks)
    first_virtual = np.cumsum(num_chunks) - num_chunks
    index_in_req = np.arange(num_virtual) - first_virtual[owner]
    chunks_after = num_chunks[owner] - 1 - index_in_req

    # Queries: the first chunk takes first_queries, later ones up to A of what remains.
    later = query_lens[owner] - first_queries[owner] - chunk * (index_in_req - 1)
    virtual_q = np.where(index_in_req == 0, first_queries[owner], np.minimum(later, chunk))
    virtual_k = np.where(chunks_after == 0, last_keys[owner], chunk)
    key_start = seq_lens[owner] - last_keys[owner] - chunk * chunks_after

    pages = chunk // block_size
    width = batch.block_table.shape[1]
    columns = (key_start[:, None] // block_size + np.arange(pages)[None, :]).clip(0, width - 1)
    device = batch.block_table.device
    rows_index = torch.from_numpy(np.repeat(owner, pages)).to(device)
    cols_index = torch.from_numpy(columns.reshape(-1)).to(device)

    def make_block_table(block_table: torch.Tensor) -> torch.Tensor:
        return block_table[rows_index, cols_index].view(num_virtual, pages)

    virtual_qsl = np.zeros(num_virtual + 1, dtype=np.int32)
    np.cumsum(virtual_q, out=virtual_qsl[1:])
    qsl_cpu = torch.from_numpy(virtual_qsl)
    seq_lens_cpu = torch.from_numpy(virtual_k.astype(np.int32))
    virtual = Batch(
        query_start_loc=qsl_cpu.to(batch.device, non_blocking=True),
        query_start_loc_cpu=qsl_cpu,
        seq_lens=seq_lens_cpu.to(batch.device, non_blocking=True),
        seq_lens_cpu=seq_lens_cpu,
        num_reqs=num_virtual,
        num_actual_tokens=batch.num_actual_tokens,
        max_query_len=int(virtual_q.max()) if num_virtual else 0,
        max_seq_len=int(virtual_k.max()) if num_virtual else 0,
        block_table=make_block_table(batch.block_table),
        slot_mapping=batch.slot_mapping,
        positions=batch.positions,
    )
    return virtual, make_block_table
