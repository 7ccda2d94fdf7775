"""Stage a step's small host inputs into their device views, in one kernel.

Reads the host staging (pinned on CUDA: the Triton kernel reads it directly through its
unified address, which costs far less inside a graph than a memcpy node) and writes, for a
launch over ``num_reqs`` requests and ``num_tokens`` tokens (both static per launch):

* ``query_start_loc[: num_reqs + 1]``, ``seq_lens[: num_reqs]``, ``slot_mapping[: num_tokens]``
  copied as they are;
* ``token_to_req[t]``: the request owning token ``t``; its absolute position
  ``positions[t] = (L_b - q_b) + (t - qsl[b])``. Tokens past the real ones
  (``t >= qsl[num_reqs]``, graph padding) get request 0 and position 0: defined values
  that are safe to index with.

Example: ``qsl = [0, 2, 3, 3]``, ``seq_lens = [6, 9, 0]``, 4 tokens ->
``token_to_req = [0, 0, 1, 0]``, ``positions = [4, 5, 8, 0]``.
"""

from __future__ import annotations

import torch

from staticattn.kernels.lazy import lazy_jit

__all__ = ["stage_inputs"]


def stage_inputs(
    backend: str,
    host_qsl: torch.Tensor,
    host_seq_lens: torch.Tensor,
    host_slot_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    slot_mapping: torch.Tensor,
    positions: torch.Tensor,
    token_to_req: torch.Tensor,
    num_reqs: int,
    num_tokens: int,
    uniform_query_len: int = 0,
) -> None:
    """Copy host staging to the device views and derive ``token_to_req`` and ``positions``.

    Parameters
    ----------
    host_qsl, host_seq_lens : int32 host tensors, ``(>= num_reqs + 1,)`` and ``(>= num_reqs,)``
    host_slot_mapping : int64 host tensor ``(>= num_tokens,)``
    query_start_loc, seq_lens : int32 device views (same capacities)
    slot_mapping, positions : int64 device views ``(>= num_tokens,)``
    token_to_req : int32 device view ``(>= num_tokens,)``
    num_reqs, num_tokens : int
        Static extent of this launch (the captured size under a graph).
    uniform_query_len : int
        When > 0, every real request has exactly this many tokens (a uniform decode step,
        the only kind a graph replays), so token ``t`` belongs to request ``t // n``: no
        search over the query starts, which would cost many small reads of host memory.
    """
    args = (host_qsl, host_seq_lens, host_slot_mapping, query_start_loc, seq_lens,
            slot_mapping, positions, token_to_req, num_reqs, num_tokens, uniform_query_len)
    if backend == "triton":
        _stage_triton(*args)
    else:
        _stage_torch(*args)


def _stage_torch(host_qsl, host_seq_lens, host_slot_mapping, query_start_loc, seq_lens,
                 slot_mapping, positions, token_to_req, num_reqs, num_tokens,
                 uniform_query_len) -> None:
    qsl = query_start_loc[: num_reqs + 1]
    qsl.copy_(host_qsl[: num_reqs + 1], non_blocking=True)
    seq_lens[:num_reqs].copy_(host_seq_lens[:num_reqs], non_blocking=True)
    slot_mapping[:num_tokens].copy_(host_slot_mapping[:num_tokens], non_blocking=True)
    if num_tokens == 0:
        return
    t = torch.arange(num_tokens, device=qsl.device, dtype=torch.int32)
    if uniform_query_len:
        req = torch.clamp(t // uniform_query_len, max=max(num_reqs - 1, 0))
    else:
        req = torch.searchsorted(qsl[1:], t, right=True).to(torch.int32)
    real = t < qsl[num_reqs]
    req = torch.where(real, req, 0)
    token_to_req[:num_tokens].copy_(req)
    lens, starts = seq_lens[req].long(), qsl[req].long()
    qlens = qsl[req + 1].long() - starts
    pos = torch.where(real, lens - qlens + (t.long() - starts), 0)
    positions[:num_tokens].copy_(pos)


@lazy_jit
def _stage_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def stage_kernel(
        host_qsl, host_seq_lens, host_slots,
        qsl_out, seq_lens_out, slots_out, positions_out, token_to_req_out,
        num_reqs, num_tokens,
        UNIFORM: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr,
    ):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        m_q = offs < num_reqs + 1
        tl.store(qsl_out + offs, tl.load(host_qsl + offs, mask=m_q), mask=m_q)
        m_r = offs < num_reqs
        tl.store(seq_lens_out + offs, tl.load(host_seq_lens + offs, mask=m_r), mask=m_r)
        m_t = offs < num_tokens
        tl.store(slots_out + offs, tl.load(host_slots + offs, mask=m_t), mask=m_t)

        total = tl.load(host_qsl + num_reqs)
        if UNIFORM > 0:
            req = offs // UNIFORM
        else:
            # Owner of token t = number of request ends qsl[1..num_reqs] that are <= t.
            req = tl.zeros([BLOCK], dtype=tl.int32)
            for c in range(0, num_reqs, CHUNK):
                ends_offs = c + tl.arange(0, CHUNK)
                ends = tl.load(host_qsl + 1 + ends_offs, mask=ends_offs < num_reqs,
                               other=2147483647)
                req += tl.sum((ends[None, :] <= offs[:, None]).to(tl.int32), axis=1)
        real = m_t & (offs < total)
        req = tl.where(real, req, 0)
        if UNIFORM > 0:
            # Known without reading host memory: every real request starts at req * n.
            start = req * UNIFORM
            query_len = tl.zeros([BLOCK], dtype=tl.int32) + UNIFORM
        else:
            start = tl.load(host_qsl + req, mask=real, other=0)
            query_len = tl.load(host_qsl + req + 1, mask=real, other=0) - start
        seq_len = tl.load(host_seq_lens + req, mask=real, other=0)
        pos = (seq_len - query_len + (offs - start)).to(tl.int64)
        pos = tl.where(real, pos, 0)
        tl.store(token_to_req_out + offs, req, mask=m_t)
        tl.store(positions_out + offs, pos, mask=m_t)

    return stage_kernel


def _stage_triton(host_qsl, host_seq_lens, host_slot_mapping, query_start_loc, seq_lens,
                  slot_mapping, positions, token_to_req, num_reqs, num_tokens,
                  uniform_query_len) -> None:
    block = 256
    extent = max(num_tokens, num_reqs + 1)
    grid = ((extent + block - 1) // block,)
    _stage_kernel()[grid](
        host_qsl, host_seq_lens, host_slot_mapping,
        query_start_loc, seq_lens, slot_mapping, positions, token_to_req,
        num_reqs, num_tokens, UNIFORM=uniform_query_len, BLOCK=block, CHUNK=64,
    )
