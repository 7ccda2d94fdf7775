"""The staging kernel against a plain-loop oracle, torch and Triton backends."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.support import DEVICE, host_steps, stage
from hypothesis import given, settings

from staticattn.arena import ArenaConfig
from staticattn.builders import make_arena


def staging_oracle(step):
    """token_to_req, positions over the padded token extent, from the spec's words."""
    qsl = step.query_start_loc
    lens = step.padded_seq_lens()
    t2r, pos = [], []
    for t in range(step.num_tokens_padded):
        owner = None
        for b in range(step.num_reqs_padded):
            if qsl[b] <= t < qsl[b + 1]:
                owner = b
        if owner is None:
            t2r.append(0)
            pos.append(0)
        else:
            t2r.append(owner)
            pos.append(lens[owner] - (qsl[owner + 1] - qsl[owner]) + (t - qsl[owner]))
    return t2r, pos


def split_oracle(step, threshold):
    """``[k, nt, D, Td]``: real requests and tokens, then the leading decodes (query length
    at most the threshold) and their tokens."""
    d = 0
    while d < step.num_reqs and step.query_lens[d] <= threshold:
        d += 1
    return [step.num_reqs, step.num_tokens, d, int(sum(step.query_lens[:d]))]


def _config(backend: str) -> ArenaConfig:
    return ArenaConfig.deepseek_v4(max_num_seqs=24, max_num_batched_tokens=192,
                                   max_model_len=2048, device=DEVICE, kernel_backend=backend)


def test_worked_example(backend):
    from helpers.support import make_step

    cfg = _config(backend)
    _, inputs = make_arena(cfg)
    batch = stage(inputs, make_step(cfg, [2, 1], [6, 9], num_reqs_padded=3, num_tokens_padded=4))
    assert batch.query_start_loc.tolist() == [0, 2, 3, 3]
    assert batch.seq_lens.tolist() == [6, 9, 0]
    assert batch.token_to_req.tolist() == [0, 0, 1, 0]
    assert batch.positions.tolist() == [4, 5, 8, 0]
    assert batch.slot_mapping.tolist()[3] == -1
    assert inputs.step_counts.tolist() == [2, 3, 2, 3]
    assert batch.query_lens.tolist() == [2, 1, 0]


@pytest.mark.parametrize("backend_name", ["torch", "triton"])
def test_staging_matches_oracle(backend_name):
    cfg = _config(backend_name)
    _, inputs = make_arena(cfg)

    @settings(max_examples=60 if backend_name == "triton" else 300)
    @given(host_steps(cfg, max_seq_len=2048))
    def check(step):
        batch = stage(inputs, step)
        t2r, pos = staging_oracle(step)
        assert batch.query_start_loc.tolist() == step.query_start_loc
        assert batch.seq_lens.tolist() == step.padded_seq_lens()
        pad = step.num_tokens_padded - step.num_tokens
        expect_slots = step.slot_mapping.tolist() + [-1] * pad
        assert batch.slot_mapping.tolist() == expect_slots
        assert batch.token_to_req.tolist() == t2r
        assert batch.positions.tolist() == pos
        assert np.array_equal(batch.query_start_loc_cpu.numpy(), np.array(step.query_start_loc))
        assert inputs.step_counts.tolist() == split_oracle(step, cfg.decode_threshold)
        pad_reqs = step.num_reqs_padded - step.num_reqs
        assert batch.query_lens.tolist() == step.query_lens.tolist() + [0] * pad_reqs

    check()


def test_staging_backends_agree_on_cpu():
    torch.manual_seed(0)
    cfg_t, cfg_tr = _config("torch"), _config("triton")
    _, a = make_arena(cfg_t)
    _, b = make_arena(cfg_tr)
    from helpers.support import make_step

    step = make_step(cfg_t, [2, 2, 1, 7], [10, 3, 1, 40], num_reqs_padded=6, num_tokens_padded=20)
    ba, bb = stage(a, step), stage(b, step)
    for f in ("query_start_loc", "seq_lens", "slot_mapping", "positions", "token_to_req",
              "query_lens"):
        assert torch.equal(getattr(ba, f), getattr(bb, f)), f


@pytest.mark.parametrize("backend_name", ["torch", "triton"])
def test_uniform_staging_matches_oracle(backend_name):
    """The replay path's division shortcut gives what the general search gives."""
    cfg = _config(backend_name)
    _, inputs = make_arena(cfg)

    @settings(max_examples=60 if backend_name == "triton" else 300)
    @given(host_steps(cfg, kinds=("uniform_decode",), max_seq_len=2048))
    def check(step):
        from helpers.support import _t

        r = step.num_reqs
        inputs.block_table[:r].copy_(_t(step.block_table))
        counts = inputs.stage(step.query_lens, step.seq_lens, step.slot_mapping,
                              num_reqs_padded=step.num_reqs_padded,
                              num_tokens_padded=step.num_tokens_padded)
        inputs.copy_to_device(counts.num_reqs_padded, counts.num_tokens_padded, uniform=True)
        t2r, pos = staging_oracle(step)
        n = step.num_tokens_padded
        assert inputs.token_to_req[:n].tolist() == t2r
        assert inputs.positions[:n].tolist() == pos
        assert inputs.step_counts.tolist() == split_oracle(step, cfg.decode_threshold)
        pad_reqs = step.num_reqs_padded - step.num_reqs
        assert (inputs.query_lens[: step.num_reqs_padded].tolist()
                == step.query_lens.tolist() + [0] * pad_reqs)

    check()
