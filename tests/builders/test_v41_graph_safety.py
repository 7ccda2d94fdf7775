"""Graph safety of the new builds: the graph builds of the SWA builder (paged prefill rows,
chunk plans), the per-layer combined and FlashInfer rows, the decoder-replay sub-batch and
the DSpark draft rows read nothing back, run the same ops whatever the data, return the same
views on every call, and launch a fixed number of kernels: the SWA builder's mixed build two
(as before the new outputs), its decode build one, the replay builder five (its sub-batch
and two SWA builds), the draft build one, each per-layer row build one; V4.1's staging one
more than V4's (the replay starts)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.op_trace import HOST_READS, OpTrace
from helpers.support import DEVICE
from helpers.v41_swa_steps import EXAMPLE_V41, example_step, stage_bucket

from staticattn.arena import ArenaConfig
from staticattn.builders import (
    Batch,
    DecoderReplayBuilder,
    DraftSWAMetadataBuilder,
    SparseSWAMetadataBuilder,
    make_arena,
)
from staticattn.kernels.staging import stage_inputs as staging
from staticattn.kernels.swa import combined_rows as swa_combined
from staticattn.kernels.swa import decoder_replay_rows as swa_replay
from staticattn.kernels.swa import draft_rows as swa_draft
from staticattn.kernels.swa import flashinfer_rows as swa_flashinfer
from staticattn.kernels.swa import prefill_gather as swa_prefill
from staticattn.kernels.swa import swa_rows as swa_decode

KERNELS = [(staging, "_copy_kernel"), (staging, "_derive_kernel"),
           (staging, "_replay_start_kernel"), (swa_decode, "_swa_decode_kernel"),
           (swa_prefill, "_gather_lens_kernel"), (swa_replay, "_replay_kernel"),
           (swa_draft, "_draft_kernel"), (swa_combined, "_combined_kernel"),
           (swa_flashinfer, "_flashinfer_kernel")]


def _world(backend: str):
    cfg = ArenaConfig(**{**EXAMPLE_V41, "kernel_backend": backend})
    swa, replay, draft = SparseSWAMetadataBuilder(), DecoderReplayBuilder(), \
        DraftSWAMetadataBuilder()
    _, inputs = make_arena(cfg, [swa, replay, draft])
    return cfg, swa, replay, draft, inputs


STEPS = [([1, 9], [10, 13], [0, 4]), ([2, 5, 3], [40, 5, 60], [0, 0, 57])]


def _graph_builds(cfg, swa, replay, draft, inputs, query_lens, seq_lens, rs):
    step, rs = example_step(cfg, query_lens, seq_lens, [list(range(1, 17))] * len(seq_lens),
                            replay_start=rs)
    batch = stage_bucket(inputs, step, rs, 4, 16)
    table = torch.ones(4, 8, dtype=torch.int32, device=DEVICE)
    topk = torch.zeros(16, 4, dtype=torch.int32, device=DEVICE)

    def run():
        meta = swa.build_mixed(batch)
        combined = swa.prefill_combined_rows(meta, "c2a", topk)
        flash = swa.flashinfer_rows(meta, "c1a", topk, compressed_block_table=table)
        sub = replay.build_mixed(batch)
        inputs.copy_to_device(2, 4, uniform=True, mark=False)
        drafted = draft.build_decode(Batch.for_decode_capture(inputs, 2))
        return meta, combined, flash, sub, drafted

    return run


def _tensors(obj) -> list:
    """Every tensor's address, shape and stride reachable through dataclass fields."""
    out = []
    for name in getattr(obj, "__slots__", ()):
        v = getattr(obj, name)
        if isinstance(v, torch.Tensor):
            out.append((name, v.data_ptr(), tuple(v.shape), tuple(v.stride())))
    return out


def test_torch_graph_builds_read_nothing_back_and_never_branch_on_data():
    cfg, swa, replay, draft, inputs = _world("torch")
    traces, views = [], []
    for query_lens, seq_lens, rs in STEPS:
        run = _graph_builds(cfg, swa, replay, draft, inputs, query_lens, seq_lens, rs)
        run()  # cut the views of this extent once
        with OpTrace() as trace:
            meta, combined, flash, sub, drafted = run()
        traces.append(trace.ops)
        views.append([_tensors(meta), _tensors(sub.swa), _tensors(drafted),
                      [(t.data_ptr(), tuple(t.shape)) for t in (*combined, *flash, sub.rows)]])
    assert not HOST_READS & set(traces[0])
    assert traces[0] == traces[1]
    assert views[0] == views[1]


def _count(monkeypatch) -> dict[str, list]:
    calls: dict[str, list] = {}
    for module, attr in KERNELS:
        define = getattr(module, attr)

        def counting(define=define, attr=attr):
            class Counting:
                def __getitem__(self, grid):
                    calls.setdefault(attr, []).append(grid)
                    return define()[grid]
            return Counting()

        monkeypatch.setattr(module, attr, counting)
    return calls


def test_triton_launches_per_build(monkeypatch):
    cfg, swa, replay, draft, inputs = _world("triton")
    step, rs = example_step(cfg, [1, 9], [10, 13], [[1, 2, 3, 4]] * 2, replay_start=[0, 4])
    calls = _count(monkeypatch)

    def launches(fn) -> dict[str, int]:
        calls.clear()
        fn()
        return {k: len(v) for k, v in calls.items()}

    batch = None

    def stage():
        nonlocal batch
        batch = stage_bucket(inputs, step, rs, 4, 16)

    assert launches(stage) == {"_copy_kernel": 1, "_derive_kernel": 1,
                               "_replay_start_kernel": 1}
    meta = None

    def mixed():
        nonlocal meta
        meta = swa.build_mixed(batch)

    assert launches(mixed) == {"_swa_decode_kernel": 1, "_gather_lens_kernel": 1}
    topk = torch.zeros(16, 4, dtype=torch.int32, device=DEVICE)
    assert launches(lambda: swa.prefill_combined_rows(meta, "c2a", topk)) == {
        "_combined_kernel": 1}
    assert launches(lambda: swa.flashinfer_rows(
        meta, "c1a", topk, compressed_block_table=torch.ones(4, 8, dtype=torch.int32,
                                                             device=DEVICE))) == {
        "_flashinfer_kernel": 1}
    assert launches(lambda: replay.build_mixed(batch)) == {
        "_replay_kernel": 1, "_swa_decode_kernel": 2, "_gather_lens_kernel": 2}
    inputs.stage_uniform_decode(np.array([10, 13]), np.arange(4))
    inputs.copy_to_device(2, 4, uniform=True)
    decode = Batch.for_decode_capture(inputs, 2)
    assert launches(lambda: swa.build_decode(decode)) == {"_swa_decode_kernel": 1}
    assert launches(lambda: draft.build_decode(decode)) == {"_draft_kernel": 1}


@pytest.mark.parametrize("arch", ["deepseek_v4", "deepseek_v41"])
def test_v4_staging_launches_no_more_than_before(monkeypatch, arch):
    ratios = (1, 4) if arch == "deepseek_v4" else (0, 2, 1)
    cfg = ArenaConfig(**{**EXAMPLE_V41, "architecture": arch, "compress_ratios": ratios,
                         "kernel_backend": "triton", "block_size": 8})
    _, inputs = make_arena(cfg, [])
    calls = _count(monkeypatch)
    inputs.stage(np.array([1, 5]), np.array([9, 5]), np.arange(6))
    inputs.copy_to_device(2, 6)
    assert ("_replay_start_kernel" in calls) == (arch == "deepseek_v41")
