"""The replay path's shortcuts agree with the general ones: the pre-screen never clears a
step the full validator rejects, and uniform staging writes what stage() writes."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from staticattn.arena import ArenaConfig
from staticattn.builders import make_arena
from staticattn.builders.validate_host import uniform_decode_passes, validate_host_step

CFG = ArenaConfig.deepseek_v4(max_num_seqs=8, max_num_batched_tokens=16, max_model_len=64,
                              device="cpu")


@settings(max_examples=2000)
@given(
    k=st.integers(0, 10),
    seq=st.lists(st.integers(-3, 70), min_size=0, max_size=10),
    slots=st.lists(st.integers(-3, 1000), min_size=0, max_size=22),
    dtype=st.sampled_from([np.int32, np.int64, np.float64]),
)
def test_prescreen_implies_full_validation(k, seq, slots, dtype):
    s = np.asarray(seq, dtype=dtype)
    sl = np.asarray(slots, dtype=np.int64)
    q = np.full(k, CFG.next_n)
    if uniform_decode_passes(k, s, sl, CFG):  # must imply: the full check passes
        validate_host_step(q, s, sl, CFG, require_decode_first=True,
                           decode_threshold=CFG.decode_threshold)


def test_uniform_staging_equals_general_staging():
    """The replay path writes only the real lengths, slots and count; the uniform staging
    kernel pads on the device to what the general path stages from padded host arrays."""
    _, a = make_arena(CFG, [])
    _, b = make_arena(CFG, [])
    rng = np.random.default_rng(0)
    names = ("query_start_loc", "seq_lens", "slot_mapping", "positions", "token_to_req",
             "step_counts")
    for _ in range(200):
        k = int(rng.integers(1, 9))
        pad = int(rng.integers(k, 9))
        s = rng.integers(2, 64, size=k).astype(np.int32)
        slots = rng.integers(-1, 500, size=2 * k)
        a.stage(np.full(k, 2), s, slots, num_reqs_padded=pad, num_tokens_padded=2 * pad)
        a.copy_to_device(pad, 2 * pad)
        b.stage_uniform_decode(s, slots)
        b.copy_to_device(pad, 2 * pad, uniform=True)
        for name in names:
            extent = {"query_start_loc": pad + 1, "seq_lens": pad, "step_counts": 4}.get(
                name, 2 * pad)
            assert torch.equal(getattr(a, name)[:extent], getattr(b, name)[:extent]), name
