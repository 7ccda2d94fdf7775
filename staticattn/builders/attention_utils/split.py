"""Where the decodes end and the prefills begin (spec §3.2), and the
three-way decode / extend / prefill split.

Pure host functions over the batch's host-side query start locations and sequence lengths;
no device reads.
"""

from __future__ import annotations

import numpy as np

from staticattn.builders.batch import Batch
from staticattn.errors import InvalidBatchError

__all__ = [
    "split_decodes_and_prefills", "split_decodes_prefills_and_extends", "DecodePrefillSplit",
    "DecodeExtendPrefillSplit",
]

DecodePrefillSplit = tuple[int, int, int, int]
DecodeExtendPrefillSplit = tuple[int, int, int, int, int, int]


def split_decodes_and_prefills(
    batch: Batch,
    decode_threshold: int = 1,
    require_uniform: bool = False,
    treat_short_extends_as_decodes: bool = True,
) -> DecodePrefillSplit:
    """Split a decode-first batch into ``(num_decodes, num_prefills, num_decode_tokens,
    num_prefill_tokens)``.

    Parameters
    ----------
    batch : Batch
        Reads ``query_start_loc_cpu`` (int32 host ``(num_reqs + 1,)``), ``num_reqs``,
        ``num_actual_tokens``, ``max_query_len`` and, when short extends are not decodes,
        ``is_prefilling`` (bool host ``(num_reqs,)``).
    decode_threshold : int
        Longest query that still counts as a decode.
    require_uniform : bool
        Decodes must all have the first request's query length; rows of query length 0
        are graph padding and count as decodes, so a padded uniform batch is all decodes.
    treat_short_extends_as_decodes : bool
        When False, a request still prefilling its prompt is a prefill whatever its length.

    Returns
    -------
    tuple of int
        ``(D, P, Td, Tp)`` with ``D + P = num_reqs`` and ``Td + Tp = num_actual_tokens``.
        ``Td`` is ``num_actual_tokens`` (padding included) when every request is a decode.

    Raises
    ------
    InvalidBatchError
        ``treat_short_extends_as_decodes=False`` on a batch without ``is_prefilling``,
        whatever the lengths (the reference asserts it only when it gets to step 4).

    Notes
    -----
    Follows the reference v0.20.2 behaviour. vLLM v0.14 asserts
    ``num_reqs * query_lens[0] == num_tokens`` for padded uniform batches and has no
    ``treat_short_extends_as_decodes``; v0.20.2 drops the assertion and adds the flag.
    The padded-uniform early return (all query lengths equal the first or are 0) happens
    before ``is_prefilling`` is consulted, as spec §3.2 orders the steps. An empty batch
    (``num_reqs = 0``) is all decodes, ``(0, 0, num_actual_tokens, 0)``.

    Examples
    --------
    Non-uniform, threshold 4, query lengths ``[2,1,3,4,5,6,7,8]`` -> ``(4, 4, 10, 26)``;
    uniform, threshold 4, ``[2,1,2,4,5,6,7,8]`` -> ``(1, 7, 2, 33)``; uniform, threshold 3,
    ``[2,2,2,0]`` padded to 8 tokens -> ``(4, 0, 8, 0)``.
    """
    if not treat_short_extends_as_decodes and batch.is_prefilling is None:
        raise InvalidBatchError(
            "treat_short_extends_as_decodes=False needs batch.is_prefilling (bool host "
            "(num_reqs,)): only it tells a short extend from a decode"
        )
    num_reqs, num_tokens = batch.num_reqs, batch.num_actual_tokens
    all_decodes = (num_reqs, 0, num_tokens, 0)
    if num_reqs == 0 or (
        batch.max_query_len <= decode_threshold
        and (not require_uniform or decode_threshold <= 1)
        and treat_short_extends_as_decodes
    ):
        return all_decodes
    qsl, query_lens, _ = batch.host_arrays()
    if query_lens[0] > decode_threshold:
        return 0, num_reqs, 0, num_tokens
    if require_uniform:
        if np.all((query_lens == query_lens[0]) | (query_lens == 0)):
            return all_decodes
        is_prefill = query_lens != query_lens[0]
    else:
        is_prefill = query_lens > decode_threshold
    if not treat_short_extends_as_decodes:
        is_prefill = is_prefill | np.asarray(batch.is_prefilling[:num_reqs], dtype=bool)
    if not is_prefill.any():
        return all_decodes
    first = int(np.argmax(is_prefill))
    num_decode_tokens = int(qsl[first])
    return first, num_reqs - first, num_decode_tokens, num_tokens - num_decode_tokens


def split_decodes_prefills_and_extends(
    batch: Batch, decode_threshold: int = 1
) -> DecodeExtendPrefillSplit:
    """Split a decode -> extend -> prefill ordered batch into ``(num_decodes, num_extends,
    num_prefills, num_decode_tokens, num_extend_tokens, num_prefill_tokens)``.

    A request longer than ``decode_threshold`` is an extend if it has context
    (``seq_len > query_len``) and a prefill if its whole sequence is scheduled now
    (``seq_len == query_len``). Decodes end at the first long request; prefills start at the
    first long request without context.

    Parameters
    ----------
    batch : Batch
        Reads ``query_start_loc_cpu`` (int32 host ``(num_reqs + 1,)``), ``seq_lens_cpu``
        (int32 host ``(num_reqs,)``), ``num_reqs``, ``num_actual_tokens``, ``max_query_len``.
    decode_threshold : int
        Longest query that still counts as a decode.

    Returns
    -------
    tuple of int
        ``(D, E, P, Td, Te, Tp)``; ``D + E + P = num_reqs``, ``Td + Te + Tp =
        num_actual_tokens``. Graph padding (tokens past ``qsl[num_reqs]``) is counted with
        the last group present, as the reference does.

    Notes
    -----
    The reference semantics (the same in vLLM v0.14 and v0.20.2), with one fix: when
    ``max_query_len`` exceeds the threshold but no query does (``max_query_len`` is only an
    upper bound), the reference's ``argmax`` over an all-false mask returns
    ``(0, 0, 0, 0, 0, 0)``, dropping every request; here every request is then a decode.

    Examples
    --------
    Threshold 1, query lengths ``[1, 1, 4, 3]``, sequence lengths ``[9, 5, 10, 3]``
    (requests 2 and 3 are long; request 3 has no context) -> ``(2, 1, 1, 2, 4, 3)``.
    """
    num_reqs, num_tokens = batch.num_reqs, batch.num_actual_tokens
    all_decodes = (num_reqs, 0, 0, num_tokens, 0, 0)
    if batch.max_query_len <= decode_threshold or num_reqs == 0:
        return all_decodes
    qsl, query_lens, seq_lens = batch.host_arrays()
    is_long = query_lens > decode_threshold
    if not is_long.any():
        return all_decodes
    is_prefill = is_long & (seq_lens == query_lens)
    first_long = int(np.argmax(is_long))
    num_decode_tokens = int(qsl[first_long])
    if not is_prefill.any():
        return (first_long, num_reqs - first_long, 0, num_decode_tokens,
                num_tokens - num_decode_tokens, 0)
    first_prefill = int(np.argmax(is_prefill))
    num_prefill_tokens = num_tokens - int(qsl[first_prefill])
    return (
        first_long, first_prefill - first_long, num_reqs - first_prefill, num_decode_tokens,
        num_tokens - num_decode_tokens - num_prefill_tokens, num_prefill_tokens,
    )
