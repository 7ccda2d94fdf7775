"""Oracle of the DCP decode consumer (``staticattn.consumers.dcp.dcp_decode``), written from its
definition with plain loops over one request's global keys: no ranks, caches or block
tables.

For decode token ``t`` of request ``b`` at position ``p``: it sees the ``(p + 1) // R``
compressed keys complete at or before it; each key ``j`` scores
``sum_h relu(q[t, h] . k_j) * w[t, h]``; the top ``K`` by score (ties: smaller ``j``) are
selected; the output is softmax attention of each head's query over the selected keys'
``(key, value)`` pairs, scaled by ``1 / sqrt(dim)`` (zeros with no key).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["decode_token"]


def decode_token(q_idx, weights, q_att, index_keys, kv, visible: int, topk: int):
    """``(ids, out)`` of one token: ``ids`` the selected key indices, best first (a list of
    ``min(topk, visible)`` ints), ``out`` float64 ``(heads, dim)``."""
    scores = []
    for j in range(visible):
        s = 0.0
        for h in range(q_idx.shape[0]):
            s += max(float(np.dot(q_idx[h], index_keys[j])), 0.0) * float(weights[h])
        scores.append((-s, j))
    ids = [j for _, j in sorted(scores)[:topk]]
    heads, dim = q_att.shape
    out = np.zeros((heads, dim))
    for h in range(heads):
        logits = [float(np.dot(q_att[h], kv[j, 0])) / math.sqrt(dim) for j in ids]
        if not logits:
            continue
        top = max(logits)
        p = [math.exp(x - top) for x in logits]
        total = sum(p)
        for j, pj in zip(ids, p):
            out[h] += pj / total * kv[j, 1]
    return ids, out
