"""KV-sharing fast prefill: a batch of only the tokens whose logits are needed (vLLM's
``make_kv_sharing_fast_prefill_common_attn_metadata``).

Layers that reuse another layer's KV cache need not run on every prompt token, only on the
tokens whose logits are sampled. The batch keeps its requests and their KV (sequence
lengths, block table) and gets new query start locations counting just those tokens.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from staticattn.builders.batch import Batch
from staticattn.errors import InvalidBatchError
from staticattn.validation.values import host_ints

__all__ = ["make_kv_sharing_fast_prefill_batch"]


def make_kv_sharing_fast_prefill_batch(
    batch: Batch,
    logits_indices_padded: torch.Tensor | np.ndarray,
    num_logits_indices: int,
) -> Batch:
    """The batch restricted to the tokens whose logits are computed.

    Parameters
    ----------
    batch : Batch
        Reads ``query_start_loc_cpu`` (int32 host ``(R + 1,)``), ``num_reqs`` and
        ``max_query_len``; the per-request fields are passed through.
    logits_indices_padded : int host tensor or array ``(>= num_logits_indices,)``
        Flat token indices (into the batch's tokens) whose logits are needed, increasing;
        entries past ``num_logits_indices`` are graph padding.
    num_logits_indices : int
        How many entries are real.

    Returns
    -------
    Batch
        ``batch`` itself when ``max_query_len == 1`` (every token is sampled already).
        Otherwise a batch with the same ``num_reqs``, ``seq_lens(_cpu)``, ``block_table``,
        ``swa_block_table``, ``max_seq_len``, ``slot_mapping`` (the parent's tokens: the KV
        was written by the layers that own it), ``query_start_loc(_cpu)`` int32 ``(R + 1,)``
        counting the selected tokens per request, ``num_actual_tokens`` = their number and
        ``max_query_len`` = the most of any request. ``positions`` and ``token_to_req`` are
        None (they index the parent's tokens).

    Raises
    ------
    InvalidBatchError
        The indices on the device (reading them would sync; pass the host copy the engine
        computed them from), not 1-D, fewer than ``num_logits_indices``, or outside the
        batch's real tokens ``[0, query_start_loc_cpu[num_reqs])``.

    Notes
    -----
    vLLM's version takes device indices and reads counts back with ``.item()`` (a host sync);
    here everything is computed from host values and the new query start locations are
    copied to the batch's device once.

    Examples
    --------
    Generation indices ``[14, 18, 19, 27]``, query start locations ``[0, 15, 20, 28]``:
    the indices belong to requests ``[0, 1, 1, 2]``, i.e. ``[1, 2, 1]`` tokens per request,
    so the new query start locations are ``[0, 1, 3, 4]`` (4 tokens, longest query 2).
    """
    if batch.max_query_len == 1:
        return batch
    padded = host_ints("logits_indices_padded", logits_indices_padded, ndim=1)
    if padded.shape[0] < num_logits_indices or num_logits_indices < 0:
        raise InvalidBatchError(
            f"logits_indices_padded has shape {padded.shape}; it must be 1-D with at least "
            f"num_logits_indices={num_logits_indices} entries"
        )
    indices = padded[:num_logits_indices].astype(np.int64)
    num_reqs = batch.num_reqs
    qsl = batch.query_start_loc_cpu.numpy()[: num_reqs + 1].astype(np.int64)
    real_tokens = int(qsl[-1])
    if indices.size and (indices.min() < 0 or indices.max() >= real_tokens):
        t = int(np.argmax((indices < 0) | (indices >= real_tokens)))
        raise InvalidBatchError(
            f"logits index {int(indices[t])} (entry {t}) is outside the batch's "
            f"{real_tokens} real tokens"
        )
    # Request of each index: how many requests end at or before it.
    owners = np.searchsorted(qsl[1:], indices, side="right")
    per_request = np.bincount(owners, minlength=num_reqs)
    new_qsl = np.zeros(num_reqs + 1, dtype=np.int32)
    np.cumsum(per_request, out=new_qsl[1:])
    qsl_cpu = torch.from_numpy(new_qsl)
    # The parent's per-token views index its tokens, and what its staging derived (counts,
    # query lengths, replay starts, spans, group tables) describes its step: none is kept.
    return replace(
        batch, query_start_loc=qsl_cpu.to(batch.device, non_blocking=True),
        query_start_loc_cpu=qsl_cpu, num_actual_tokens=int(indices.size),
        max_query_len=int(per_request.max()) if num_reqs else 0, positions=None,
        token_to_req=None, step_counts=None, query_lens=None, replay_start=None,
        block_tables=None, image_spans=None,
    )
