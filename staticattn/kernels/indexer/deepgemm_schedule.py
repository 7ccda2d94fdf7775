"""DeepGEMM's own paged-MQA-logits schedule, as a second opinion on ours.

:func:`deepgemm_schedule` calls ``deep_gemm.get_paged_mqa_logits_metadata(context_lens,
block_kv=64, num_sms)`` (deepgemm-flashmla.md §1.2). It is used by the equality test against
:func:`staticattn.kernels.indexer.mqa_schedule.paged_mqa_schedule`, and can fill the builder's
schedule buffer (:func:`deepgemm_schedule_into`).

Why the indexer builder does **not** use it by default: DeepGEMM allocates a fresh
``(num_sms + 1, 2)`` tensor on every call, with no ``out=``. Inside a capture that tensor comes
from the graph's private pool, so its address is only good inside that graph, and the
reference engine has to add a copy into a persistent buffer after it (one more kernel per
step). It also JIT-compiles one kernel per 32-wide batch bucket and ``num_sms``, which must be
warmed before capture. Our arena-owned kernel writes the same schedule straight into the
builder's fixed buffer in one launch, needs no JIT, runs on CPU too, and is checked against
this function bit for bit on the GPU (``tests/kernels/test_dsa_schedule_gpu.py``).
"""

from __future__ import annotations

import torch

from staticattn.errors import InvalidBatchError
from staticattn.kernels.runtime.dsa_libs import DEEP_GEMM, require

__all__ = ["deepgemm_num_sms", "deepgemm_schedule", "deepgemm_schedule_into", "BLOCK_KV"]

#: Keys per paged-MQA-logits page on sm90 (the only value DeepGEMM accepts there).
BLOCK_KV = 64


def deepgemm_num_sms() -> int:
    """The SM count DeepGEMM's logits kernel uses (and checks the schedule's rows against)."""
    return int(require(DEEP_GEMM).get_num_sms())


def deepgemm_schedule(context_lens: torch.Tensor, num_sms: int | None = None) -> torch.Tensor:
    """DeepGEMM's schedule of ``context_lens``: a fresh int32 ``(num_sms + 1, 2)`` tensor.

    Parameters
    ----------
    context_lens : int32 CUDA ``(B, next_n)``, contiguous, non-negative
        Only column ``next_n - 1`` counts (DeepGEMM reads it as uint32).
    num_sms : int, optional
        Default: :func:`deepgemm_num_sms` (what ``fp8_paged_mqa_logits`` asserts).

    Raises
    ------
    BackendUnavailableError
        Without ``deep_gemm`` or CUDA.
    InvalidBatchError
        For a tensor DeepGEMM would reject (it asserts instead of raising).
    """
    dg = require(DEEP_GEMM)
    if (context_lens.dim() != 2 or context_lens.dtype != torch.int32
            or not context_lens.is_contiguous() or context_lens.device.type != "cuda"):
        raise InvalidBatchError(
            "DeepGEMM's schedule needs int32 contiguous CUDA context lengths of shape "
            f"(B, next_n); got {context_lens.dtype} {tuple(context_lens.shape)} on "
            f"{context_lens.device}, contiguous={context_lens.is_contiguous()}"
        )
    sms = deepgemm_num_sms() if num_sms is None else int(num_sms)
    return dg.get_paged_mqa_logits_metadata(context_lens, BLOCK_KV, sms)


def deepgemm_schedule_into(context_lens: torch.Tensor, out: torch.Tensor) -> None:
    """Copy DeepGEMM's schedule into a persistent ``out`` (``(num_sms + 1, 2)`` int32), as
    the reference engine does: two launches and one pool allocation per call."""
    out.copy_(deepgemm_schedule(context_lens, out.shape[0] - 1))
