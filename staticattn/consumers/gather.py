"""A small built-in consumer step: reads the metadata the way attention kernels do.

For every decode token ``t`` it gathers from three fake caches it owns and writes one row of
checksums into its own output buffer ``(max_num_batched_tokens, 3)`` int64:

* col 0: sum of ``swa_cache[i]`` over the token's SWA window indices (first ``decode_swa_lens``);
* col 1: sum of ``c128a_cache[i]`` over its C128A top-k indices (0 without C128A layers);
* col 2: the indexer's view: for entry ``t`` of the flattened decode lengths (length ``len``,
  row ``r``), the sum of ``index_cache[bt[r, k // S] * S + k % S]`` over the last
  ``min(len, 32)`` compressed keys ``k < len`` (block table = the indexer's decode table,
  ``S`` = storage block size) -- what the paged-MQA logits would read last.

Prefill tokens (eager mixed steps) get zero rows. Any wrong index, length or block-table row
changes a checksum, so comparing the rows of replay and eager runs compares the metadata
through a real consumer. Triton on CUDA (graph-safe: no allocation, no host read), torch on CPU.
"""

from __future__ import annotations

import torch

from staticattn.arena import ArenaConfig
from staticattn.builders.batch import Batch
from staticattn.kernels.backend import resolve_backend
from staticattn.kernels.lazy import lazy_jit
from staticattn.kernels.swa_decode import C128A_RATIO

__all__ = ["GatherConsumer"]

#: How many of the most recent compressed keys the indexer checksum reads per entry.
INDEX_TAIL = 32


class GatherConsumer:
    """Callable step ``(batch, metadata) -> (num_tokens, 3) int64`` over owned buffers.

    Parameters
    ----------
    config : ArenaConfig
    num_kv_blocks : int
        Blocks of each fake cache; block ids of the batch must be below it.
    seed : int
        Fills the caches with random values.
    """

    def __init__(self, config: ArenaConfig, num_kv_blocks: int = 4096, seed: int = 0) -> None:
        self.config = config
        dev = config.torch_device
        gen = torch.Generator(device="cpu").manual_seed(seed)

        def cache(entries: int) -> torch.Tensor:
            return torch.randint(0, 1 << 20, (entries,), generator=gen, dtype=torch.int32).to(dev)

        self.swa_cache = cache(num_kv_blocks * config.swa_block_size)
        self.c128a_cache = cache(num_kv_blocks * max(config.block_size // C128A_RATIO, 1))
        self.index_cache = cache(num_kv_blocks * config.storage_block_size)
        self.out = torch.zeros(config.max_num_batched_tokens, 3, dtype=torch.int64, device=dev)
        self.backend = resolve_backend(config.kernel_backend, dev)

    def __call__(self, batch: Batch, metadata: dict) -> torch.Tensor:
        swa = metadata.get("swa")
        idx = metadata.get("indexer")
        num_tokens = batch.num_actual_tokens
        td = (swa if swa is not None else idx).num_decode_tokens
        out = self.out[:num_tokens]
        swa_idx = swa.decode_swa_indices if swa is not None else None
        swa_len = swa.decode_swa_lens if swa is not None else None
        c128_idx = swa.c128a_decode_indices if swa is not None else None
        c128_len = swa.c128a_decode_lens if swa is not None else None
        if idx is not None and idx.decode is not None:
            index_lens = idx.decode.seq_lens
            index_bt = idx.decode.block_table
        else:
            index_lens = index_bt = None
        args = (swa_idx, swa_len, c128_idx, c128_len, index_lens, index_bt, out, td, num_tokens)
        if self.backend == "triton":
            self._triton(*args)
        else:
            self._torch(*args)
        return out

    # ------------------------------------------------------------------ torch
    def _torch(self, swa_idx, swa_len, c_idx, c_len, i_lens, i_bt, out, td, num_tokens):
        out.zero_()
        if td == 0:
            return
        if swa_idx is not None:
            ar = torch.arange(swa_idx.shape[-1], device=out.device)
            sidx = swa_idx[:td, 0].long()
            m = ar[None, :] < swa_len[:td, None]
            out[:td, 0] = torch.where(m, self.swa_cache[sidx.clamp(min=0)].long(), 0).sum(1)
        if c_idx is not None:
            ci = c_idx[:td, 0].long()
            arc = torch.arange(ci.shape[-1], device=out.device)
            mc = arc[None, :] < c_len[:td, None]
            out[:td, 1] = torch.where(mc, self.c128a_cache[ci.clamp(min=0)].long(), 0).sum(1)
        if i_lens is not None:
            flat = i_lens.reshape(-1)
            e = min(td, flat.shape[0])
            width = i_lens.shape[1]
            lens = flat[:e].long()
            rows = torch.arange(e, device=out.device) // width
            k = lens[:, None] - INDEX_TAIL + torch.arange(INDEX_TAIL, device=out.device)[None]
            valid = k >= 0
            k = k.clamp(min=0)
            s = self.config.storage_block_size
            blocks = i_bt[rows[:, None], (k // s)].long()
            vals = self.index_cache[blocks * s + k % s].long()
            out[:e, 2] = torch.where(valid, vals, 0).sum(1)

    # ----------------------------------------------------------------- triton
    def _triton(self, swa_idx, swa_len, c_idx, c_len, i_lens, i_bt, out, td, num_tokens):
        if num_tokens == 0:
            return
        has_s = swa_idx is not None
        has_c = c_idx is not None
        has_i = i_lens is not None
        w = swa_idx.shape[-1] if has_s else 1
        any_i32 = i_lens if has_i else swa_len
        maxc = c_idx.shape[-1] if has_c else 1
        width = i_lens.shape[1] if has_i else 1
        entries = i_lens.numel() if has_i else 0
        _consumer_kernel()[(num_tokens,)](
            swa_idx if has_s else any_i32, swa_len if has_s else any_i32, self.swa_cache,
            c_idx if has_c else any_i32, c_len if has_c else any_i32, self.c128a_cache,
            any_i32, i_bt if has_i else any_i32, self.index_cache,
            i_bt.stride(0) if has_i else 0,
            out, td, entries, width, self.config.storage_block_size,
            W=w, MAXC=maxc, HAS_S=has_s, HAS_C=has_c, HAS_I=has_i,
            BLOCK_W=max(16, 1 << (w - 1).bit_length()), BLOCK_C=1024, TAIL=INDEX_TAIL,
        )


@lazy_jit
def _consumer_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def consumer(
        swa_idx, swa_len, swa_cache, c_idx, c_len, c_cache, i_lens, i_bt, i_cache, i_bt_stride,
        out, td, entries, width, storage_bs,
        W: tl.constexpr, MAXC: tl.constexpr, HAS_S: tl.constexpr, HAS_C: tl.constexpr,
        HAS_I: tl.constexpr,
        BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr, TAIL: tl.constexpr,
    ):
        t = tl.program_id(0)
        is_dec = t < td
        s_sum = tl.zeros([BLOCK_W], dtype=tl.int64)
        if HAS_S:
            ow = tl.arange(0, BLOCK_W)
            n = tl.load(swa_len + t, mask=is_dec, other=0)
            idx = tl.load(swa_idx + t * W + ow, mask=is_dec & (ow < n), other=0)
            s_sum += tl.load(swa_cache + idx, mask=is_dec & (ow < n), other=0).to(tl.int64)
        tl.store(out + t * 3, tl.sum(s_sum, 0))
        c_sum = tl.zeros([BLOCK_C], dtype=tl.int64)
        if HAS_C:
            nc = tl.load(c_len + t, mask=is_dec, other=0)
            for c0 in range(0, MAXC, BLOCK_C):
                oc = c0 + tl.arange(0, BLOCK_C)
                m = is_dec & (oc < nc)
                ci = tl.load(c_idx + t * MAXC + oc, mask=m, other=0)
                c_sum += tl.load(c_cache + ci, mask=m, other=0).to(tl.int64)
        tl.store(out + t * 3 + 1, tl.sum(c_sum, 0))
        i_sum = tl.zeros([TAIL], dtype=tl.int64)
        if HAS_I:
            has = is_dec & (t < entries)
            ln = tl.load(i_lens + t, mask=has, other=0)
            row = t // width
            k = ln - TAIL + tl.arange(0, TAIL)
            m = has & (k >= 0)
            k = tl.maximum(k, 0)
            blk = tl.load(i_bt + row * i_bt_stride + k // storage_bs, mask=m, other=0)
            i_sum += tl.load(i_cache + blk.to(tl.int64) * storage_bs + k % storage_bs, mask=m,
                             other=0).to(tl.int64)
        tl.store(out + t * 3 + 2, tl.sum(i_sum, 0))

    return consumer
