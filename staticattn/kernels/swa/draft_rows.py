"""The DSpark draft step's sliding-window rows (``docs/spec/deepseek-v41.md`` §7.5, §9.2):
non-causal, one window shared by every token of a request's draft block.

For token ``t`` of request ``b`` (query length ``q_b``, sequence length ``L_b``, prefix
``L_b - q_b``): the window ``[max(prefix - W, 0), L_b)`` as flat SWA slots in a row of
``round_up(W + num_spec, 64)``, length ``L_b - start``, then -1; ``is_valid_token[t] =
slot_mapping[t] >= 0``; an invalid token and every row past the step's real tokens: -1,
length 0. Example (W = 4, SWA pages of 4, block row ``[3, 5, 7]``): ``L = 10, q = 2`` ->
window 4 .. 9: ``[20, 21, 22, 23, 28, 29]``, length 6.
"""

from __future__ import annotations

import torch

from staticattn.kernels.runtime.backend import triton_interpreted
from staticattn.kernels.runtime.compiled_launch import grid_size, launch, pow2_at_least
from staticattn.kernels.runtime.deferred import lazy_jit
from staticattn.kernels.staging.stage_inputs import COUNT_TOKENS
from staticattn.kernels.staging.step_counts import step_counts_jit
from staticattn.kernels.swa.swa_rows_torch import gather_slots
from staticattn.kernels.swa.window import window_rows_jit

__all__ = ["draft_swa_rows"]


def draft_swa_rows(backend: str, indices: torch.Tensor, lens: torch.Tensor,
                   is_valid: torch.Tensor, slot_mapping: torch.Tensor,
                   token_to_req: torch.Tensor, query_start_loc: torch.Tensor,
                   seq_lens: torch.Tensor, swa_block_table: torch.Tensor, *,
                   swa_block_size: int, window: int, num_tokens: int,
                   counts: int | torch.Tensor) -> None:
    """Write the draft rows of tokens ``[0, num_tokens)`` (module docstring).

    Parameters
    ----------
    indices : int32 ``(>= num_tokens, 1, width)`` contiguous;  lens : int32 ``(>= num_tokens,)``
    is_valid : bool ``(>= num_tokens,)``
    slot_mapping : int64 ``(>= num_tokens,)``;  token_to_req : int32 ``(>= num_tokens,)``
    query_start_loc : int32 ``(num_reqs + 1,)``;  seq_lens : int32 ``(num_reqs,)``
    swa_block_table : int32 ``(num_reqs, cols)``
    counts : the step's real token count (static), or the staging's ``step_counts``.
    """
    if num_tokens == 0:
        return
    device_counts = isinstance(counts, torch.Tensor)
    width = indices.shape[-1]
    if backend == "triton":
        rows = 16 if triton_interpreted() else 2
        launch(_draft_kernel(), (grid_size(num_tokens, rows),),
            indices, lens, is_valid, slot_mapping, token_to_req, query_start_loc, seq_lens,
            swa_block_table, swa_block_table.stride(0), counts if device_counts else lens,
            0 if device_counts else counts, num_tokens, window,
            WIDTH=width, SWA_BLOCK=swa_block_size, DEVICE_COUNTS=device_counts, ROWS=rows,
            BLOCK_W=pow2_at_least(width, 16),
        )
        return
    dev = slot_mapping.device
    nt = counts[COUNT_TOKENS] if device_counts else torch.full((), counts, device=dev)
    t = torch.arange(num_tokens, device=dev)
    valid = (slot_mapping[:num_tokens] >= 0) & (t < nt)
    is_valid[:num_tokens].copy_(slot_mapping[:num_tokens] >= 0)
    req = token_to_req[:num_tokens].long()
    length = seq_lens[req].long()
    q = (query_start_loc[req + 1] - query_start_loc[req]).long()
    start = (length - q - window).clamp(min=0)
    n = torch.where(valid, length - start, 0)
    lens[:num_tokens].copy_(n)
    indices[:num_tokens, 0].copy_(gather_slots(swa_block_table, req[:, None], start[:, None],
                                               n[:, None], valid[:, None], width,
                                               swa_block_size))


@lazy_jit(step_counts_jit, window_rows_jit)
def _draft_kernel(triton, tl, live_count, SLOT_TOKENS, window_rows, **_):
    @triton.jit(do_not_specialize=["swa_bt_stride", "nt_static", "num_tokens", "window"])
    def draft_kernel(indices, lens, is_valid, slot_mapping, token_to_req, qsl, seq_lens,
                     swa_block_table, swa_bt_stride, counts, nt_static, num_tokens, window,
                     WIDTH: tl.constexpr, SWA_BLOCK: tl.constexpr,
                     DEVICE_COUNTS: tl.constexpr, ROWS: tl.constexpr, BLOCK_W: tl.constexpr):
        t = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        in_rows = t < num_tokens
        nt = live_count(counts, SLOT_TOKENS, nt_static, DEVICE_COUNTS)
        slot = tl.load(slot_mapping + t, mask=in_rows, other=-1)
        tl.store(is_valid + t, slot >= 0, mask=in_rows)
        live = in_rows & (slot >= 0) & (t < nt)
        req = tl.load(token_to_req + t, mask=live, other=0).to(tl.int64)
        length = tl.load(seq_lens + req, mask=live, other=0)
        q = tl.load(qsl + req + 1, mask=live, other=0) - tl.load(qsl + req, mask=live, other=0)
        start = tl.maximum(length - q - window, 0)
        window_rows(indices, WIDTH, lens, t, in_rows, live, req, start, length - start,
                    swa_block_table, swa_bt_stride, WIDTH, SWA_BLOCK, BLOCK_W, True, False)

    return draft_kernel
