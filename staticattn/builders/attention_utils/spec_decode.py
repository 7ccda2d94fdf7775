"""Views between flat token tensors and ``(batch, next_n, ...)`` tensors for uniform
speculative (MTP) decodes, where every request has the same query length."""

from __future__ import annotations

import torch

from staticattn.errors import InvalidBatchError

__all__ = ["reshape_attn_output_for_spec_decode", "reshape_query_for_spec_decode"]


def reshape_query_for_spec_decode(query: torch.Tensor, batch_size: int) -> torch.Tensor:
    """View a flat query as ``(batch_size, seq_len, num_heads, head_dim)``.

    Parameters
    ----------
    query : tensor ``(num_tokens, num_heads, head_dim)``, any dtype
        Tokens of ``batch_size`` requests of equal query length, request-major.
    batch_size : int
        Requests; must divide ``num_tokens``.

    Returns
    -------
    tensor ``(batch_size, num_tokens // batch_size, num_heads, head_dim)``
        A view of ``query`` (no copy; graph-safe). Splitting one axis in two is always a
        view, whatever the strides.

    Raises
    ------
    InvalidBatchError
        ``query`` not 3-D, or ``batch_size`` not positive or not dividing the token count.

    Examples
    --------
    >>> import torch
    >>> reshape_query_for_spec_decode(torch.zeros(6, 4, 8), 3).shape
    torch.Size([3, 2, 4, 8])
    """
    if query.dim() != 3:
        raise InvalidBatchError(
            f"query must be 3-D (num_tokens, num_heads, head_dim), got shape "
            f"{tuple(query.shape)}"
        )
    num_tokens, num_heads, head_dim = query.shape
    if batch_size < 1 or num_tokens % batch_size:
        raise InvalidBatchError(
            f"num_tokens={num_tokens} is not a multiple of batch_size={batch_size}; a "
            "speculative decode batch has the same query length in every request"
        )
    return query.view(batch_size, num_tokens // batch_size, num_heads, head_dim)


def reshape_attn_output_for_spec_decode(attn_output: torch.Tensor) -> torch.Tensor:
    """View ``(batch_size, seq_len, num_heads, head_dim)`` as ``(num_tokens, num_heads,
    head_dim)``; a 3-D tensor is returned as it is.

    Parameters
    ----------
    attn_output : tensor, 3-D or 4-D, any dtype

    Returns
    -------
    tensor ``(batch_size * seq_len, num_heads, head_dim)``
        A view (no copy; graph-safe).

    Raises
    ------
    InvalidBatchError
        Neither 3-D nor 4-D, or batch and sequence axes that cannot be merged without a
        copy.

    Examples
    --------
    >>> import torch
    >>> reshape_attn_output_for_spec_decode(torch.zeros(3, 2, 4, 8)).shape
    torch.Size([6, 4, 8])
    """
    if attn_output.dim() == 3:
        return attn_output
    if attn_output.dim() != 4:
        raise InvalidBatchError(
            f"attn_output must be 3-D or 4-D (batch, seq_len, num_heads, head_dim), got "
            f"shape {tuple(attn_output.shape)}"
        )
    batch, seq_len, num_heads, head_dim = attn_output.shape
    try:
        return attn_output.view(batch * seq_len, num_heads, head_dim)
    except RuntimeError as exc:
        raise InvalidBatchError(
            f"attn_output of shape {tuple(attn_output.shape)} and strides "
            f"{attn_output.stride()} cannot be viewed as ({batch * seq_len}, {num_heads}, "
            f"{head_dim}) without a copy (its first two axes are not contiguous together): "
            f"{exc}"
        ) from None
