"""The staging graph of the staging tests on the GPU: its captured extent and what its
consumer (each token's position plus its request's sequence length) must read."""

from __future__ import annotations

S = 32  # requests in the captured step


def staged_sums(query_lens, seq_lens, n):
    """Per token of a step staged into ``S * n`` tokens: its position plus its request's
    sequence length; padded tokens read request 0 at position 0."""
    out = []
    for q, L in zip(query_lens, seq_lens):
        out += [L - q + j + L for j in range(q)]
    # Padded tokens belong to request 0 at position 0 (defined, safe to index with).
    return out + [seq_lens[0]] * (S * n - len(out))
