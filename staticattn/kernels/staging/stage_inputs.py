"""Stage a step's small host inputs into their device views, padding on the device.

The host writes only the real values into pinned staging -- query start locations
``host_qsl[: k + 1]``, sequence lengths ``host_seq_lens[:k]``, slots ``host_slots[:nt]`` -- and
the real counts ``host_counts = [k, nt, S]`` (``S``: the image span rows a vision model's step
carries, read by the general staging only). The kernels read them (pinned memory, through its
unified address) for a launch over a *static* extent of ``R`` requests and ``T`` tokens (the
captured size or bucket) and write the device views, padding what lies past the real step:

* ``qsl[b]`` for ``b <= R``: ``host_qsl[b]`` up to ``k``, then ``nt`` (padded requests have
  query length 0); ``seq_lens[b]``: the host value, 0 past ``k``; ``slots[t]``: the host
  value, -1 past ``nt``;
* ``token_to_req[t]`` (the request owning token ``t``) and its absolute position
  ``positions[t] = (L_b - q_b) + (t - qsl[b])``; tokens past the real ones get request 0 and
  position 0, defined values that are safe to index with;
* ``query_lens[b] = qsl[b + 1] - qsl[b]`` for ``b < R`` (0 past ``k``);
* image spans: ``spans[r] = host_spans[r]`` for ``r < S``, the unused row ``(-1, -1, -1)``
  past it, whatever the host block holds there (nothing on the host clears rows);
* ``step_counts = [k, nt, D, Td]``: the real counts and the decode/prefill split
  (``D`` leading requests with ``q <= decode_threshold``, ``Td = qsl[D]`` their tokens), for
  builds that must not take them from the host (graphs of any composition).

Three ways, chosen by static facts:

* **uniform** (every real request has ``n`` tokens: a decode graph): one kernel; request of
  token ``t`` is ``t // n``, so nothing is searched;
* **general** (any composition): a copy kernel (the only reader of pinned memory; with
  image spans it brings their block too), then a derive kernel that searches the device
  copy of the query starts, which is cached, instead of pinned memory, which costs a bus
  round trip per read;
* **device starts** (the query starts, lengths and slots were written on the device by an
  earlier kernel, e.g. a drafter deciding how many tokens each request verifies): a pad
  kernel completes those device views in place -- the real token count ``nt = qsl[k]`` is
  read on the device, capped at the extent ``T`` -- then the same derive kernel. The host
  supplies only ``k`` (``host_counts[0]``).

Token views: what the later kernels read of a step, documented here once --
``query_start_loc`` (the padded ``qsl``, int32 device ``(>= num_reqs + 1,)``;
``query_start_loc[num_reqs]`` is the real token count), ``positions`` (int64 device
``(>= num_tokens,)``, each token's absolute position) and ``token_to_req`` (int32 device
``(>= num_tokens,)``, each token's request: a valid block-table row, padded tokens' too), over
the static extent ``num_reqs``, ``num_tokens`` (the captured size or bucket under a graph).

Example: ``host_qsl = [0, 2, 3]``, ``host_seq_lens = [6, 9]``, counts ``[2, 3]``, extent
``R = 3, T = 4`` -> ``qsl = [0, 2, 3, 3]``, ``seq_lens = [6, 9, 0]``, ``token_to_req =
[0, 0, 1, 0]``, ``positions = [4, 5, 8, 0]``, ``step_counts[:4] = [2, 3, 2, 3]`` (threshold 2).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from staticattn.kernels.runtime.compiled_launch import grid_size, launch, pow2_at_least
from staticattn.kernels.runtime.deferred import lazy_jit
from staticattn.kernels.staging.pinned_staging import PinnedStaging

__all__ = [
    "COUNT_DECODE_TOKENS", "COUNT_DECODES", "COUNT_REQS", "COUNT_SPANS", "COUNT_TOKENS",
    "NUM_COUNTS", "StagingViews", "stage_device", "stage_general", "stage_replay_start",
    "stage_uniform",
]

#: Slots of ``step_counts`` (int32, device); the pinned ``host_counts`` holds ``k, nt`` and, in
#: slot ``COUNT_SPANS``, the image span rows to read.
COUNT_REQS, COUNT_TOKENS, COUNT_DECODES, COUNT_DECODE_TOKENS, COUNT_SPANS = 0, 1, 2, 3, 2
#: Length of both count vectors.
NUM_COUNTS = 4

_BLOCK = 256
_CHUNK = 128


@dataclass(frozen=True, slots=True)
class StagingViews:
    """The tensors the staging kernels read and write.

    host : PinnedStaging of pinned tensors (:mod:`~staticattn.kernels.staging.pinned_staging`)
    qsl, seq_lens : int32 device ``(R_max + 1,)``, ``(R_max,)``
    slots, positions : int64 device ``(T_max,)``;  token_to_req : int32 device ``(T_max,)``
    step_counts : int32 device ``(NUM_COUNTS,)``;  query_lens : int32 device ``(R_max,)``
    spans : int32 device ``(max_image_spans, 3)``, or None: image spans (then in ``host`` too)
    """

    host: PinnedStaging[torch.Tensor]
    qsl: torch.Tensor
    seq_lens: torch.Tensor
    slots: torch.Tensor
    positions: torch.Tensor
    token_to_req: torch.Tensor
    step_counts: torch.Tensor
    query_lens: torch.Tensor
    spans: torch.Tensor | None = None


def stage_uniform(backend: str, v: StagingViews, num_reqs: int, query_len: int) -> None:
    """Stage a uniform step over ``num_reqs`` requests of ``query_len`` tokens (static); the
    real count ``k = host_counts[0]`` may be smaller (graph padding). One kernel."""
    if backend == "triton":
        extent = max(num_reqs * query_len, num_reqs + 1)
        launch(_uniform_kernel(), (grid_size(extent, _BLOCK),),
            v.host.seq_lens, v.host.slot_mapping, v.host.counts, v.qsl, v.seq_lens, v.slots,
            v.positions, v.token_to_req, v.step_counts, v.query_lens, num_reqs, query_len,
            BLOCK=_BLOCK, NUM_COUNTS=NUM_COUNTS,
        )
        return
    k = v.host.counts[COUNT_REQS].to(v.qsl.device, non_blocking=True)
    b = torch.arange(num_reqs + 1, device=v.qsl.device, dtype=torch.int32)
    v.qsl[: num_reqs + 1].copy_(torch.minimum(b, k) * query_len)
    v.query_lens[:num_reqs].copy_(torch.where(b[:-1] < k, query_len, 0))
    _copy_padded(v.host.seq_lens, v.seq_lens, num_reqs, k, 0)
    nt = k * query_len
    _copy_padded(v.host.slot_mapping, v.slots, num_reqs * query_len, nt, -1)
    t = torch.arange(num_reqs * query_len, device=v.qsl.device, dtype=torch.int32)
    real = t < nt
    req = torch.where(real, t // query_len, 0)
    v.token_to_req[: t.shape[0]].copy_(req)
    pos = v.seq_lens[req].long() - query_len + (t - req * query_len)
    v.positions[: t.shape[0]].copy_(torch.where(real, pos, 0))
    v.step_counts.copy_(torch.stack([k, nt, k, nt]))


def stage_general(backend: str, v: StagingViews, num_reqs: int, num_tokens: int,
                  decode_threshold: int) -> None:
    """Stage any step over a static extent of ``num_reqs`` requests and ``num_tokens``
    tokens; the real counts come from ``host_counts``. Two kernels: copy, then derive. The
    copy brings the image span block too, where there is one (no node of its own)."""
    if backend == "triton":
        extent = max(num_tokens, num_reqs + 1)
        spans = v.spans is not None
        launch(_copy_kernel(), (grid_size(extent, _BLOCK),),
            v.host.query_start_loc, v.host.seq_lens, v.host.slot_mapping, v.host.counts, v.qsl,
            v.seq_lens, v.slots, v.step_counts, v.host.image_spans if spans else v.host.counts,
            v.spans if spans else v.step_counts, num_reqs, num_tokens,
            SPAN_ENTRIES=v.spans.numel() if spans else 0,
            BLOCK_SPANS=pow2_at_least(v.spans.numel() if spans else 1, 16), BLOCK=_BLOCK,
        )
        _derive(v, num_reqs, num_tokens, decode_threshold)
        return
    dev = v.qsl.device
    if v.spans is not None:  # the first S rows (3 words each), then -1
        _copy_padded(v.host.image_spans.view(-1), v.spans.view(-1), v.spans.numel(),
                     3 * v.host.counts[COUNT_SPANS].to(dev, non_blocking=True), -1)
    k = v.host.counts[COUNT_REQS].to(dev, non_blocking=True)
    nt = v.host.counts[COUNT_TOKENS].to(dev, non_blocking=True)
    b = torch.arange(num_reqs + 1, device=dev, dtype=torch.int32)
    host_qsl = v.host.query_start_loc[: num_reqs + 1].to(dev, non_blocking=True)
    qsl = v.qsl[: num_reqs + 1]
    qsl.copy_(torch.where(b <= k, host_qsl, nt))
    _copy_padded(v.host.seq_lens, v.seq_lens, num_reqs, k, 0)
    _copy_padded(v.host.slot_mapping, v.slots, num_tokens, nt, -1)
    _derive_torch(v, num_reqs, num_tokens, decode_threshold, k, nt)


def _derive(v: StagingViews, num_reqs: int, num_tokens: int, decode_threshold: int) -> None:
    """Triton: each token's request and position, and the split, from the padded device
    query starts and lengths (``step_counts[:2]`` already hold ``k, nt``)."""
    launch(_derive_kernel(), (grid_size(num_tokens, _BLOCK),),
        v.qsl, v.seq_lens, v.positions, v.token_to_req, v.step_counts, v.query_lens,
        num_reqs, num_tokens, decode_threshold, BLOCK=_BLOCK, CHUNK=_CHUNK,
    )


def _derive_torch(v: StagingViews, num_reqs: int, num_tokens: int, decode_threshold: int,
                  k: torch.Tensor, nt: torch.Tensor) -> None:
    """Torch twin of :func:`_derive`; ``k`` and ``nt`` are 0-d device tensors."""
    dev = v.qsl.device
    qsl = v.qsl[: num_reqs + 1]
    b = torch.arange(num_reqs + 1, device=dev, dtype=torch.int32)
    t = torch.arange(num_tokens, device=dev, dtype=torch.int32)
    real = t < nt
    req = torch.where(real, torch.searchsorted(qsl[1:], t, right=True).to(torch.int32), 0)
    v.token_to_req[:num_tokens].copy_(req)
    start = qsl[req].long()
    pos = v.seq_lens[req].long() - (qsl[req + 1].long() - start) + (t.long() - start)
    v.positions[:num_tokens].copy_(torch.where(real, pos, 0))
    query_lens = qsl[1:] - qsl[:-1]
    v.query_lens[:num_reqs].copy_(query_lens)
    longer = (b[:-1] < k) & (query_lens > decode_threshold)
    num_decodes = torch.where(longer, b[:-1], k).min() if num_reqs else k
    # (Indexing with a 0-d device tensor would read it back: gather instead.)
    decode_tokens = qsl.index_select(0, num_decodes.long().reshape(1))[0]
    v.step_counts.copy_(torch.stack([k, nt.to(k.dtype), num_decodes.to(k.dtype),
                                     decode_tokens.to(k.dtype)]))


def stage_device(backend: str, v: StagingViews, num_reqs: int, num_tokens: int,
                 decode_threshold: int) -> None:
    """Stage a step whose ``qsl[: k + 1]``, ``seq_lens[:k]`` and ``slots[:nt]`` are already on
    the device (written by an earlier kernel); ``k = host_counts[0]``, ``nt = min(qsl[k],
    num_tokens)``. Pads those views in place over the static extent, then derives as
    :func:`stage_general` does. Two kernels."""
    if backend == "triton":
        extent = max(num_tokens, num_reqs + 1)
        launch(_pad_kernel(), (grid_size(extent, _BLOCK),),
            v.host.counts, v.qsl, v.seq_lens, v.slots, v.step_counts, num_reqs, num_tokens,
            BLOCK=_BLOCK,
        )
        _derive(v, num_reqs, num_tokens, decode_threshold)
        return
    dev = v.qsl.device
    k = v.host.counts[COUNT_REQS].to(dev, non_blocking=True)
    qsl = v.qsl[: num_reqs + 1]
    nt = torch.clamp(qsl.index_select(0, k.long().reshape(1))[0], max=num_tokens)
    b = torch.arange(num_reqs + 1, device=dev, dtype=torch.int32)
    qsl.copy_(torch.where(b <= k, torch.minimum(qsl, nt), nt))
    seq = v.seq_lens[:num_reqs]
    seq.copy_(torch.where(b[:-1] < k, seq, 0))
    t = torch.arange(num_tokens, device=dev)
    v.slots[:num_tokens].copy_(torch.where(t < nt, v.slots[:num_tokens], -1))
    _derive_torch(v, num_reqs, num_tokens, decode_threshold, k, nt)


def stage_replay_start(backend: str, host_replay_start: torch.Tensor,
                       step_counts: torch.Tensor, replay_start: torch.Tensor,
                       num_reqs: int) -> None:
    """Stage the bounded-replay starts (``docs/spec/deepseek-v41.md`` §8.1) after the split:
    ``replay_start[b] = host_replay_start[b]`` for the prefill requests ``D <= b < k`` of
    ``step_counts``, 0 for decodes and padded requests (only prefilling requests replay),
    whichever staging found the split (a step whose lengths a device kernel wrote has its
    replay starts from the host too). One kernel over the static extent of ``num_reqs``
    requests; int32 ``(>= num_reqs,)`` host (pinned) and device views."""
    if backend == "triton":
        launch(_replay_start_kernel(), (grid_size(num_reqs, _BLOCK),),
            host_replay_start, step_counts, replay_start, num_reqs, BLOCK=_BLOCK,
        )
        return
    dev = replay_start.device
    b = torch.arange(num_reqs, device=dev)
    prefill = (b >= step_counts[COUNT_DECODES]) & (b < step_counts[COUNT_REQS])
    host = host_replay_start[:num_reqs].to(dev, non_blocking=True)
    replay_start[:num_reqs].copy_(torch.where(prefill, host, 0))


def _copy_padded(src: torch.Tensor, dst: torch.Tensor, extent: int, real: torch.Tensor,
                 pad: int) -> None:
    """``dst[i] = src[i]`` for ``i < real`` (a 0-d device tensor), ``pad`` up to ``extent``."""
    i = torch.arange(extent, device=dst.device)
    dst[:extent].copy_(torch.where(i < real, src[:extent].to(dst.device, non_blocking=True),
                                   pad))


@lazy_jit()
def _uniform_kernel(triton, tl):
    @triton.jit(do_not_specialize=["num_reqs", "query_len"])
    def uniform_kernel(
        host_seq_lens, host_slots, host_counts,
        qsl_out, seq_lens_out, slots_out, positions_out, token_to_req_out, counts_out,
        query_lens_out, num_reqs, query_len, BLOCK: tl.constexpr, NUM_COUNTS: tl.constexpr,
    ):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        k = tl.load(host_counts)
        nt = k * query_len
        tl.store(qsl_out + offs, tl.minimum(offs, k) * query_len, mask=offs <= num_reqs)
        m_r = offs < num_reqs
        seq = tl.load(host_seq_lens + offs, mask=m_r & (offs < k), other=0)
        tl.store(seq_lens_out + offs, seq, mask=m_r)
        tl.store(query_lens_out + offs, tl.where(offs < k, query_len, 0), mask=m_r)
        m_t = offs < num_reqs * query_len
        real = m_t & (offs < nt)
        tl.store(slots_out + offs, tl.load(host_slots + offs, mask=real, other=-1), mask=m_t)
        # Every real request starts at req * n: no search, no read of the query starts.
        req = tl.where(real, offs // query_len, 0)
        seq_t = tl.load(host_seq_lens + req, mask=real, other=0)
        pos = tl.where(real, (seq_t - query_len + (offs - req * query_len)).to(tl.int64), 0)
        tl.store(token_to_req_out + offs, req, mask=m_t)
        tl.store(positions_out + offs, pos, mask=m_t)
        # Every request of a uniform step is a decode: D = k, Td = nt.
        if tl.program_id(0) == 0:
            c = tl.arange(0, NUM_COUNTS)
            tl.store(counts_out + c, tl.where(c % 2 == 0, k, nt))

    return uniform_kernel


@lazy_jit()
def _copy_kernel(triton, tl):
    @triton.jit(do_not_specialize=["num_reqs", "num_tokens"])
    def copy_kernel(
        host_qsl, host_seq_lens, host_slots, host_counts,
        qsl_out, seq_lens_out, slots_out, counts_out, host_spans, spans_out,
        num_reqs, num_tokens,
        SPAN_ENTRIES: tl.constexpr, BLOCK_SPANS: tl.constexpr, BLOCK: tl.constexpr,
    ):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        k = tl.load(host_counts)
        nt = tl.load(host_counts + 1)
        m_q = offs <= num_reqs
        qsl = tl.load(host_qsl + offs, mask=m_q & (offs <= k), other=0)
        tl.store(qsl_out + offs, tl.where(offs <= k, qsl, nt), mask=m_q)
        m_r = offs < num_reqs
        seq = tl.load(host_seq_lens + offs, mask=m_r & (offs < k), other=0)
        tl.store(seq_lens_out + offs, seq, mask=m_r)
        m_t = offs < num_tokens
        slot = tl.load(host_slots + offs, mask=m_t & (offs < nt), other=-1)
        tl.store(slots_out + offs, slot, mask=m_t)
        # The real counts travel on the device; the derive kernel completes the vector.
        if tl.program_id(0) == 0:
            tl.store(counts_out, k)
            tl.store(counts_out + 1, nt)
            if SPAN_ENTRIES > 0:  # the span block: the first S rows, the rest unused
                e = tl.arange(0, BLOCK_SPANS)
                used = e < 3 * tl.load(host_counts + 2)  # host_counts[COUNT_SPANS]
                span = tl.load(host_spans + e, mask=used & (e < SPAN_ENTRIES), other=-1)
                tl.store(spans_out + e, span, mask=e < SPAN_ENTRIES)

    return copy_kernel


@lazy_jit()
def _pad_kernel(triton, tl):
    @triton.jit(do_not_specialize=["num_reqs", "num_tokens"])
    def pad_kernel(host_counts, qsl, seq_lens, slots, counts_out, num_reqs, num_tokens,
                   BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        k = tl.load(host_counts)
        # Written by the earlier kernel; no program writes qsl[k] (only starts past k), so
        # every program reads the same value. Capped at the extent: nothing past it exists.
        nt = tl.minimum(tl.load(qsl + k), num_tokens)
        m_q = offs <= num_reqs
        start = tl.load(qsl + offs, mask=m_q & (offs < k), other=0)
        tl.store(qsl + offs, tl.where(offs < k, tl.minimum(start, nt), nt),
                 mask=m_q & (offs != k))
        tl.store(seq_lens + offs, 0, mask=(offs < num_reqs) & (offs >= k))
        tl.store(slots + offs, -1, mask=(offs < num_tokens) & (offs >= nt))
        if tl.program_id(0) == 0:
            tl.store(qsl + k, nt)
            tl.store(counts_out, k)
            tl.store(counts_out + 1, nt)

    return pad_kernel


@lazy_jit()
def _derive_kernel(triton, tl):
    @triton.jit(do_not_specialize=["num_reqs", "num_tokens", "decode_threshold"])
    def derive_kernel(
        qsl, seq_lens, positions_out, token_to_req_out, counts, query_lens_out, num_reqs,
        num_tokens, decode_threshold, BLOCK: tl.constexpr, CHUNK: tl.constexpr,
    ):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        k = tl.load(counts)
        nt = tl.load(counts + 1)
        # Owner of token t = number of request ends qsl[1..R] that are <= t; padded
        # requests end at nt, so only real tokens find a real owner.
        req = tl.zeros([BLOCK], dtype=tl.int32)
        first_long = tl.zeros([CHUNK], dtype=tl.int32) + k
        for c0 in range(0, num_reqs, CHUNK):
            b = c0 + tl.arange(0, CHUNK)
            in_reqs = b < num_reqs
            ends = tl.load(qsl + 1 + b, mask=in_reqs, other=2147483647)
            req += tl.sum((ends[None, :] <= offs[:, None]).to(tl.int32), axis=1)
            if pid == 0:
                starts = tl.load(qsl + b, mask=in_reqs, other=0)
                tl.store(query_lens_out + b, ends - starts, mask=in_reqs)
                longer = (b < k) & (ends - starts > decode_threshold)
                first_long = tl.minimum(first_long, tl.where(longer, b, k))
        real = (offs < num_tokens) & (offs < nt)
        req = tl.where(real, req, 0)
        start = tl.load(qsl + req, mask=real, other=0)
        query_len = tl.load(qsl + req + 1, mask=real, other=0) - start
        seq_len = tl.load(seq_lens + req, mask=real, other=0)
        pos = tl.where(real, (seq_len - query_len + (offs - start)).to(tl.int64), 0)
        m_t = offs < num_tokens
        tl.store(token_to_req_out + offs, req, mask=m_t)
        tl.store(positions_out + offs, pos, mask=m_t)
        if pid == 0:
            # The decode/prefill split: decodes lead (D requests with q <= threshold).
            num_decodes = tl.min(first_long, axis=0)
            tl.store(counts + 2, num_decodes)
            tl.store(counts + 3, tl.load(qsl + num_decodes))

    return derive_kernel


@lazy_jit()
def _replay_start_kernel(triton, tl):
    @triton.jit(do_not_specialize=["num_reqs"])
    def replay_start_kernel(host_replay_start, counts, replay_start_out, num_reqs,
                            BLOCK: tl.constexpr):
        b = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        prefill = (b >= tl.load(counts + 2)) & (b < tl.load(counts))
        value = tl.load(host_replay_start + b, mask=prefill, other=0)
        tl.store(replay_start_out + b, value, mask=b < num_reqs)

    return replay_start_kernel
