"""The gather consumer's device work: per-token checksums through every kind of metadata
(see :mod:`staticattn.consumers.emulated.gather` for what each column sums).

:class:`GatherArgs` collects what one launch reads -- the batch's views, the metadata's
views and which split bounds them -- and :func:`gather_checksums` launches it: one Triton
program per token, or the same sums with torch ops. The dense column of the prefill tokens
is left 0 here and summed chunk by chunk by
:mod:`staticattn.consumers.emulated.dense_prefill_checksums`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from staticattn.kernels.runtime.compiled_launch import launch, pow2_at_least
from staticattn.kernels.runtime.deferred import lazy_jit
from staticattn.kernels.staging.stage_inputs import COUNT_DECODE_TOKENS, COUNT_DECODES, COUNT_TOKENS

__all__ = ["GatherArgs", "gather_checksums", "paged_sum_jit", "torch_paged_sum"]

#: How many of the most recent compressed keys the indexer checksum reads per token.
INDEX_TAIL = 32


@dataclass
class GatherArgs:
    """What one consumer launch reads. Tensors are views; ``None`` parts are absent.

    The split: the real token count and the SWA decode tokens always come from the staging's
    ``step_counts`` (the same rule as every SWA build); the indexer's decode tokens are
    ``idx_decode_tokens`` (an eager or decode build, exact) or ``step_counts`` as well (a
    mixed build, where the int fields are capacities).
    """

    num_tokens: int
    token_to_req: torch.Tensor
    positions: torch.Tensor
    query_start_loc: torch.Tensor
    block_table: torch.Tensor
    swa_block_table: torch.Tensor | None
    step_counts: torch.Tensor
    caches: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    window: int
    swa_block_size: int
    dense_entries: int
    storage_block_size: int
    swa: dict[str, Any] | None = None
    indexer: dict[str, Any] | None = None
    #: A prefill chunk plan laid out as a mixed build's: chunk bounds int32 ``(C, 8)``, their
    #: count ``(1,)``, key prefix sums, per-token key ranges ``ks``, ``ke`` ``(T,)``.
    plan: tuple[torch.Tensor, ...] | None = None
    #: The output column of the indexer checksum (2; DeepSeek V4.1 launches once per index
    #: type, each into a column of its own).
    index_column: int = 2
    #: Whether this launch writes the SWA and dense columns (0, 1): the first launch of a
    #: step does, the other index types' launches leave them.
    window_columns: bool = True

    def set_swa(self, md) -> None:
        """Read the sparse SWA metadata: decode window and dense rows, prefill gather
        lengths, the dense prefill rows' chunks."""
        self.swa = dict(
            indices=md.decode_swa_indices, lens=md.decode_swa_lens,
            gather_lens=md.prefill_gather_lens, prefill_seq_lens=md.prefill_seq_lens,
            c_indices=md.dense_decode_indices, c_lens=md.dense_decode_lens,
            dense_prefill=md.dense_prefill,
        )

    def set_indexer(self, md) -> None:
        """Read the indexer metadata: decode lengths and block table (native or flattened)."""
        d = md.decode
        if d is None:
            self.indexer = dict(lens=None, decode_tokens=0, device_counts=False)
            return
        mixed = md.prefill is not None and md.prefill.plan is not None
        self.indexer = dict(
            lens=d.seq_lens, table=d.block_table,
            # The native layout reads the batch's own block table; flattening, an expanded one.
            flatten=d.block_table.data_ptr() != self.block_table.data_ptr(),
            decode_tokens=md.num_decode_tokens, device_counts=mixed,
        )


def gather_checksums(backend: str, a: GatherArgs, out: torch.Tensor) -> None:
    """Write columns 0, 1 (when ``a.window_columns``) and ``a.index_column`` of
    ``out[:num_tokens]`` (int64 ``(num_tokens, columns)``, contiguous rows); see the module
    docstring."""
    if a.num_tokens == 0:
        return
    if backend == "triton":
        _launch_triton(a, out)
    else:
        _torch(a, out)


# ------------------------------------------------------------------------ torch
def _sum_rows(cache, index, keep):
    """Row sums of ``cache[index]`` where ``keep`` (indices clamped into the cache)."""
    safe = index.long().clamp(0, cache.shape[0] - 1)
    return torch.where(keep, cache[safe].long(), 0).sum(-1)


def torch_paged_sum(cache, table, rows, pos, block_size, keep):
    """Row sums of ``cache`` over the slots of positions ``pos`` (``>= 0``) of requests
    ``rows`` through their block-table rows, where ``keep``. A position not kept may lie past
    the table (a window reaching beyond its token), so it reads column 0 instead, as the
    Triton twin's masked load does."""
    pos = torch.where(keep, pos, 0)
    blocks = table[rows[:, None], pos // block_size].long()
    return _sum_rows(cache, blocks * block_size + pos % block_size, keep)


def _torch(a: GatherArgs, out: torch.Tensor) -> None:
    dev = out.device
    t = torch.arange(a.num_tokens, device=dev)
    counts = a.step_counts
    nt, num_decodes = counts[COUNT_TOKENS], counts[COUNT_DECODES]
    td = counts[COUNT_DECODE_TOKENS]
    real = t < nt
    b = torch.where(real, a.token_to_req[: a.num_tokens].long(), 0)
    p = torch.where(real, a.positions[: a.num_tokens], 0)
    swa_cache, dense_cache, index_cache = a.caches
    out[:, a.index_column].zero_()
    if a.window_columns:
        out[:, :2].zero_()
    if a.swa is not None and a.window_columns:
        s = a.swa
        rows = s["lens"].shape[0]
        dec = t < td
        r = t.clamp(max=max(rows - 1, 0))
        w = torch.arange(a.window, device=dev)
        swa_dec = swa_pre = torch.zeros_like(t)
        if rows:
            swa_dec = _sum_rows(swa_cache, s["indices"][r, 0],
                                dec[:, None] & (w < s["lens"][r, None]))
        if s["gather_lens"] is not None:
            i = (b - num_decodes).clamp(0, s["gather_lens"].shape[0] - 1)
            start = s["prefill_seq_lens"][i].long() - s["gather_lens"][i].long()
            lo = torch.maximum(p - a.window + 1, start)
            pos = lo[:, None] + w
            keep = (real & ~dec)[:, None] & (pos <= p[:, None]) & (pos >= 0)
            swa_pre = torch_paged_sum(swa_cache, a.swa_block_table, b, pos.clamp(min=0),
                                 a.swa_block_size, keep)
        out[:, 0] = torch.where(dec & real, swa_dec, swa_pre)
        if s["c_indices"] is not None and rows:
            o = torch.arange(s["c_indices"].shape[-1], device=dev)
            c_dec = _sum_rows(dense_cache, s["c_indices"][r, 0], dec[:, None] & (
                o < s["c_lens"][r, None]))
            out[:, 1] = torch.where(dec & real, c_dec, 0)
    if a.indexer is not None:
        out[:, a.index_column] = _index_sums(a, t, real, b, index_cache)


def _index_sums(a: GatherArgs, t, real, b, cache):
    x, dev, size = a.indexer, t.device, a.storage_block_size
    k_tail = torch.arange(INDEX_TAIL, device=dev)
    result = torch.zeros_like(t)
    td = a.step_counts[COUNT_DECODE_TOKENS] if x["device_counts"] else x["decode_tokens"]
    dec = real & (t < td)
    if x["lens"] is not None:
        lens, table = x["lens"], x["table"]
        if x["flatten"]:
            row = t.clamp(max=lens.shape[0] - 1)
            col = torch.zeros_like(t)
        else:
            row = b.clamp(max=lens.shape[0] - 1)
            qsl = a.query_start_loc.long()
            col = lens.shape[1] - (qsl[row + 1] - qsl[row]) + (t - qsl[row])
        n = lens[row, col.clamp(0, lens.shape[1] - 1)].long()
        k = n[:, None] - INDEX_TAIL + k_tail
        sums = torch_paged_sum(cache, table, row, k.clamp(min=0), size, dec[:, None] & (k >= 0))
        result = torch.where(dec, sums, result)
    if a.plan is not None:
        bounds, num_chunks, cu, ks, ke = a.plan
        c = torch.arange(bounds.shape[0], device=dev)
        inside = ((bounds[None, :, 2] <= t[:, None]) & (t[:, None] < bounds[None, :, 3])
                  & (c < num_chunks[0]))
        found = real & ~dec & inside.any(1)
        start = bounds[inside.long().argmax(1), 0].long()
        cu_b = cu[(start + b).clamp(max=cu.shape[0] - 1)].long()
        hi = ke[: t.shape[0]].long()
        i = hi[:, None] - INDEX_TAIL + k_tail
        keep = found[:, None] & (i >= ks[: t.shape[0], None]) & (i - cu_b[:, None] >= 0)
        k = (i - cu_b[:, None]).clamp(min=0)
        sums = torch_paged_sum(cache, a.block_table, b, k, size, keep)
        result = torch.where(found, sums, result)
    return result


# ----------------------------------------------------------------------- triton
def _launch_triton(a: GatherArgs, out: torch.Tensor) -> None:
    swa, idx, plan = a.swa or {}, a.indexer or {}, a.plan
    placeholder = a.token_to_req  # an int32 view for absent parts; never dereferenced
    has_s = bool(swa) and a.window_columns
    has_pre = has_s and swa["gather_lens"] is not None
    has_c = has_s and swa["c_indices"] is not None
    has_i = bool(idx) and idx.get("lens") is not None
    c_width = swa["c_indices"].shape[-1] if has_c else 1

    def v(tensor):
        return tensor if tensor is not None else placeholder

    swa_bt = a.swa_block_table if a.swa_block_table is not None else a.block_table
    i_lens = idx["lens"] if has_i else placeholder
    i_table = idx["table"] if has_i else a.block_table
    bounds, num_chunks, cu, ks, ke = plan if plan is not None else (placeholder,) * 5
    swa_cache, dense_cache, index_cache = a.caches
    launch(_gather_kernel(), (a.num_tokens,),
        out, a.token_to_req, a.positions, a.query_start_loc, a.block_table,
        a.block_table.stride(0), swa_bt, swa_bt.stride(0), a.step_counts,
        v(swa.get("indices")), v(swa.get("lens")), v(swa.get("gather_lens")),
        v(swa.get("prefill_seq_lens")), v(swa.get("c_indices")), v(swa.get("c_lens")),
        i_lens, i_table, i_table.stride(0), bounds, num_chunks, cu, ks, ke,
        swa_cache, dense_cache, index_cache, swa_cache.shape[0], dense_cache.shape[0],
        index_cache.shape[0], swa["lens"].shape[0] if has_s else 0,
        swa["gather_lens"].shape[0] if has_pre else 0,
        i_lens.shape[0] if has_i else 0, i_lens.shape[1] if has_i else 1,
        idx.get("decode_tokens", 0), bounds.shape[0] if plan is not None else 0,
        a.window, a.swa_block_size, a.storage_block_size, out.stride(0),
        HAS_S=has_s, HAS_PRE=has_pre, HAS_C=has_c, HAS_I=has_i,
        HAS_PLAN=plan is not None, I_FLATTEN=bool(idx.get("flatten")),
        I_DEVICE_COUNTS=bool(idx.get("device_counts")), C_WIDTH=c_width,
        BLOCK_W=pow2_at_least(a.window, 16), BLOCK_C=min(pow2_at_least(c_width, 16), 1024),
        TAIL=INDEX_TAIL, BLOCK_CHUNKS=64, I_COL=a.index_column, WRITE_SC=a.window_columns,
    )


@lazy_jit()
def paged_sum_jit(triton, tl):
    """The ``@triton.jit`` helper ``paged_sum`` (taken through
    :func:`~staticattn.kernels.runtime.deferred.lazy_jit`)."""

    @triton.jit
    def paged_sum(table_row, pos, keep, page, cache, cache_size):
        """Values of ``cache`` at the slots of positions ``pos`` through one request's
        block-table row (``table_row``, pages of ``page`` entries), where ``keep`` and the
        slot lies in the cache; int64."""
        blk = tl.load(table_row + pos // page, mask=keep, other=0)
        slot = blk.to(tl.int64) * page + pos % page
        keep = keep & (slot >= 0) & (slot < cache_size)
        return tl.load(cache + slot, mask=keep, other=0).to(tl.int64)

    return paged_sum


@lazy_jit(paged_sum_jit)
def _gather_kernel(triton, tl, paged_sum):
    @triton.jit(do_not_specialize=["swa_rows", "pre_rows", "i_rows",
                                   "i_decode_tokens", "max_chunks"])
    def gather_kernel(
        out, token_to_req, positions, qsl, bt, bt_stride, swa_bt, swa_bt_stride, counts,
        swa_idx, swa_len, gather_lens, pre_seq_lens, c_idx, c_len,
        i_lens, i_bt, i_bt_stride, bounds, num_chunks, cu, ks, ke,
        swa_cache, c_cache, i_cache, swa_size, c_size, i_size,
        swa_rows, pre_rows, i_rows, i_width, i_decode_tokens, max_chunks,
        window, swa_bs, storage_bs, out_stride,
        HAS_S: tl.constexpr, HAS_PRE: tl.constexpr, HAS_C: tl.constexpr,
        HAS_I: tl.constexpr, HAS_PLAN: tl.constexpr,
        I_FLATTEN: tl.constexpr, I_DEVICE_COUNTS: tl.constexpr, C_WIDTH: tl.constexpr,
        BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr, TAIL: tl.constexpr,
        BLOCK_CHUNKS: tl.constexpr, I_COL: tl.constexpr, WRITE_SC: tl.constexpr,
    ):
        t = tl.program_id(0)
        real = t < tl.load(counts + 1)
        num_decodes = tl.load(counts + 2)
        td = tl.load(counts + 3)
        b = tl.where(real, tl.load(token_to_req + t), 0).to(tl.int64)
        p = tl.where(real, tl.load(positions + t), 0)
        dec = real & (t < td)
        s_sum = tl.zeros([BLOCK_W], dtype=tl.int64)
        c_sum = tl.zeros([BLOCK_C], dtype=tl.int64)
        if HAS_S:
            w = tl.arange(0, BLOCK_W)
            row = tl.minimum(t, swa_rows - 1)
            n = tl.load(swa_len + row, mask=dec, other=0)
            # A per-token condition joins a vector mask through tl.where (Triton's
            # interpreter cannot broadcast a scalar bool in &).
            in_row = tl.where(dec, w < n, False)
            idx = tl.load(swa_idx + row * window + w, mask=in_row, other=0)
            keep = in_row & (idx >= 0) & (idx < swa_size)
            s_sum += tl.load(swa_cache + idx, mask=keep, other=0).to(tl.int64)
            if HAS_PRE:
                pre = real & (t >= td)
                i = tl.minimum(tl.maximum(b - num_decodes, 0), pre_rows - 1)
                start = (tl.load(pre_seq_lens + i, mask=pre, other=0)
                         - tl.load(gather_lens + i, mask=pre, other=0)).to(tl.int64)
                pos = tl.maximum(p - window + 1, start) + w
                keep = tl.where(pre, (pos <= p) & (pos >= 0) & (w < window), False)
                s_sum += paged_sum(swa_bt + b * swa_bt_stride, tl.maximum(pos, 0), keep,
                                   swa_bs, swa_cache, swa_size)
        if HAS_C:
            row = tl.minimum(t, swa_rows - 1)
            nc = tl.load(c_len + row, mask=dec, other=0)
            # Loop bodies use names of their own: Triton keeps a name's type in a loop.
            for c0 in range(0, C_WIDTH, BLOCK_C):
                oc = c0 + tl.arange(0, BLOCK_C)
                mc = tl.where(dec, oc < nc, False)
                ci = tl.load(c_idx + row.to(tl.int64) * C_WIDTH + oc, mask=mc, other=0)
                mc = mc & (ci >= 0) & (ci < c_size)
                c_sum += tl.load(c_cache + ci, mask=mc, other=0).to(tl.int64)
        i_sum = tl.zeros([TAIL], dtype=tl.int64)
        if I_DEVICE_COUNTS:
            i_td = td
        else:
            i_td = i_decode_tokens
        if HAS_I:
            i_dec = real & (t < i_td)
            if I_FLATTEN:
                row = tl.minimum(t, i_rows - 1).to(tl.int64)
                col = 0
            else:
                row = tl.minimum(b, i_rows - 1)
                first = tl.load(qsl + row)
                col = i_width - (tl.load(qsl + row + 1) - first) + (t - first)
                col = tl.minimum(tl.maximum(col, 0), i_width - 1)
            n = tl.load(i_lens + row * i_width + col, mask=i_dec, other=0)
            k = n - TAIL + tl.arange(0, TAIL)
            m = tl.where(i_dec, k >= 0, False)
            i_sum += paged_sum(i_bt + row * i_bt_stride, tl.maximum(k, 0), m, storage_bs,
                               i_cache, i_size)
        if HAS_PLAN:
            # The chunk holding token t: token_start <= t < token_end.
            pre = real & (t >= i_td)
            start_req = tl.zeros([], tl.int64) - 1
            count = tl.load(num_chunks)
            for c0 in range(0, max_chunks, BLOCK_CHUNKS):
                ch = c0 + tl.arange(0, BLOCK_CHUNKS)
                in_table = (ch < max_chunks) & (ch < count)
                tok_lo = tl.load(bounds + ch * 8 + 2, mask=in_table, other=0)
                tok_hi = tl.load(bounds + ch * 8 + 3, mask=in_table, other=0)
                req_lo = tl.load(bounds + ch * 8, mask=in_table, other=0).to(tl.int64)
                hit = in_table & (tok_lo <= t) & (t < tok_hi)
                start_req = tl.maximum(start_req, tl.max(tl.where(hit, req_lo, -1), 0))
            pre = pre & (start_req >= 0)
            cu_b = tl.load(cu + tl.maximum(start_req, 0) + b, mask=pre, other=0)
            hi_t = tl.load(ke + t, mask=pre, other=0)
            lo_t = tl.load(ks + t, mask=pre, other=0)
            i = hi_t - TAIL + tl.arange(0, TAIL)
            k = i - cu_b
            m = tl.where(pre, (i >= lo_t) & (k >= 0), False)
            i_sum += paged_sum(bt + b * bt_stride, tl.maximum(k, 0), m, storage_bs, i_cache,
                               i_size)
        row_out = out + t.to(tl.int64) * out_stride
        if WRITE_SC:
            tl.store(row_out, tl.sum(s_sum, 0))
            tl.store(row_out + 1, tl.sum(c_sum, 0))
        tl.store(row_out + I_COL, tl.sum(i_sum, 0))

    return gather_kernel
