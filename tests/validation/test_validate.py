"""Batch validation: a catalogue of bad batches, each with its typed error and a message naming
the limit, raised before anything is written; and the oracle over generated host steps."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import numpy as np
import pytest
import torch
from helpers import planning as oracle
from helpers.support import host_steps, make_step, stage
from hypothesis import given, settings
from hypothesis import strategies as st

from staticattn.arena import ArenaConfig
from staticattn.builders import Batch, make_arena, validate, validate_host_step
from staticattn.errors import CapacityError, InvalidBatchError

# next_n 2 (decode threshold 2); main blocks of 256 tokens (4 columns), SWA blocks of 64
# (16 columns); slots address the SWA group.
CONFIG = ArenaConfig.deepseek_v4(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=1024,
                                 device="cpu", kernel_backend="torch")
NUM_BLOCKS = 100_000  # make_step draws block ids in [1, NUM_BLOCKS)
QUERY_LENS = [2, 2, 1, 30]
SEQ_LENS = [100, 300, 50, 700]


@pytest.fixture(scope="module")
def staged():
    """An arena holding one valid step, staged with graph padding (6 requests, 40 tokens)."""
    arena, inputs = make_arena(CONFIG)
    step = make_step(CONFIG, QUERY_LENS, SEQ_LENS, num_reqs_padded=6, num_tokens_padded=40)
    batch = stage(inputs, step)
    return arena, inputs, step, batch


def _snapshot(arena):
    return (arena.block("device").clone(), arena.block("host").clone(), arena.fingerprint())


def _assert_unchanged(arena, snapshot):
    device, host, fingerprint = snapshot
    assert torch.equal(arena.block("device"), device)
    assert torch.equal(arena.block("host"), host)
    assert arena.fingerprint() == fingerprint


def test_the_staged_step_is_valid(staged):
    arena, _, step, batch = staged
    validate(batch, CONFIG, require_decode_first=True, num_kv_blocks=NUM_BLOCKS,
             check_device_values=True)
    validate_host_step(step.query_lens, step.seq_lens, step.slot_mapping, CONFIG,
                       num_reqs_padded=6, num_tokens_padded=40, require_decode_first=True,
                       block_table=step.block_table, swa_block_table=step.swa_block_table,
                       num_kv_blocks=NUM_BLOCKS)


# ------------------------------------------------------------------- host-step catalogue
def _host(**changes) -> Callable:
    """A host-step defect: the valid step's arrays with some replaced."""

    def call(step):
        args = dict(query_lens=step.query_lens, seq_lens=step.seq_lens,
                    slot_mapping=step.slot_mapping, block_table=step.block_table,
                    swa_block_table=step.swa_block_table, num_kv_blocks=NUM_BLOCKS)
        for key, change in changes.items():
            args[key] = change(step) if callable(change) else change
        return args

    return call


def _edit(name: str, index, value):
    def change(step):
        array = getattr(step, name).copy()
        array[index] = value
        return array

    return change


HOST_DEFECTS = {
    "too-many-requests": (
        _host(query_lens=np.ones(9, np.int32), seq_lens=np.full(9, 5, np.int32),
              slot_mapping=np.arange(9), block_table=None, swa_block_table=None),
        CapacityError, ["num_reqs=9", "max_num_seqs=8"]),
    "too-many-tokens": (
        _host(query_lens=np.array([2, 2, 1, 60]), slot_mapping=np.arange(65)),
        CapacityError, ["num_tokens=65", "max_num_batched_tokens=64"]),
    "padding-over-capacity": (
        _host(num_tokens_padded=80), CapacityError, ["num_tokens=80", "max_num_batched_tokens=64"]),
    "sequence-too-long": (
        _host(seq_lens=_edit("seq_lens", 3, 1025)), CapacityError,
        ["seq_lens[3]=1025", "max_model_len=1024"]),
    "negative-query-length": (
        _host(query_lens=np.array([2, 2, -1, 30]), slot_mapping=np.arange(33)),
        InvalidBatchError, ["query_lens[2]=-1", ">= 0"]),
    "negative-sequence-length": (
        _host(seq_lens=_edit("seq_lens", 1, -3)), InvalidBatchError, ["seq_lens[1]=-3", ">= 0"]),
    "query-longer-than-sequence": (
        _host(seq_lens=_edit("seq_lens", 3, 20)), InvalidBatchError,
        ["schedules 30 tokens", "seq_lens[3]=20"]),
    "slot-count-mismatch": (
        _host(slot_mapping=lambda s: s.slot_mapping[:-1]), InvalidBatchError,
        ["sum to 35 tokens", "34 entries"]),
    "slot-below-pad": (
        _host(slot_mapping=_edit("slot_mapping", 5, -2)), InvalidBatchError,
        ["slot_mapping[5]=-2", "below -1"]),
    "slot-beyond-pool": (
        _host(slot_mapping=np.where(np.arange(35) == 7, 640, np.arange(35)), num_kv_blocks=None,
              num_swa_kv_blocks=10, block_table=None, swa_block_table=None),
        InvalidBatchError, ["slot_mapping[7]=640", "640 slots"]),
    "decode-after-prefill": (
        _host(query_lens=np.array([2, 30, 2, 1]), seq_lens=np.array([100, 700, 300, 50]),
              require_decode_first=True, block_table=None, swa_block_table=None),
        InvalidBatchError, ["request 2 is a decode (query length 2 <= decode_threshold=2)",
                            "follows request 1"]),
    "host-block-id-out-of-range": (
        _host(block_table=_edit("block_table", (1, 1), 10**6)), InvalidBatchError,
        ["block_table[1, 1]=1000000", "[0, 100000)"]),
    "host-swa-table-too-narrow": (
        _host(swa_block_table=lambda s: s.swa_block_table[:, :10]), InvalidBatchError,
        ["swa_block_table has 10 columns", "700 tokens", "cdiv(700, 64) = 11"]),
    "padding-below-the-step": (
        _host(num_reqs_padded=3), InvalidBatchError, ["(3 requests", "(4 requests"]),
    "float-lengths": (
        _host(query_lens=np.array([2.0, 2.0, 1.0, 30.0])), InvalidBatchError,
        ["query_lens must hold integers", "float64"]),
    "two-dimensional-lengths": (
        _host(seq_lens=lambda s: s.seq_lens[None, :]), InvalidBatchError,
        ["seq_lens must be 1-D", "(1, 4)"]),
    "lengths-disagree": (
        _host(seq_lens=lambda s: s.seq_lens[:3]), InvalidBatchError,
        ["seq_lens has 3 entries", "query_lens has 4"]),
    "lengths-on-the-device": (
        _host(seq_lens=torch.zeros(4, dtype=torch.int32, device="meta")), InvalidBatchError,
        ["seq_lens is on meta", "host copy"]),
}


@pytest.mark.parametrize("name", list(HOST_DEFECTS))
def test_host_step_defect(staged, name):
    arena, inputs, step, _ = staged
    make_args, error, fragments = HOST_DEFECTS[name]
    args = make_args(step)
    before = _snapshot(arena)
    staged_anyway = []

    def validated_stage():
        query_lens, seq_lens, slots = (args.pop(k) for k in
                                       ("query_lens", "seq_lens", "slot_mapping"))
        validate_host_step(query_lens, seq_lens, slots, CONFIG, **args)
        staged_anyway.append(inputs.stage(query_lens, seq_lens, slots))

    with pytest.raises(error) as info:
        validated_stage()
    assert type(info.value) is error
    for fragment in fragments:
        assert fragment in str(info.value)
    assert not staged_anyway
    _assert_unchanged(arena, before)


# ------------------------------------------------------------------------ batch catalogue
def _replace(**changes) -> Callable[[Batch], Batch]:
    def call(batch: Batch) -> Batch:
        fields = {k: (v(batch) if callable(v) else v) for k, v in changes.items()}
        return dataclasses.replace(batch, **fields)

    return call


def _cloned(name: str, index, value):
    def change(batch: Batch) -> torch.Tensor:
        tensor = getattr(batch, name).clone()
        tensor[index] = value
        return tensor

    return change


def _tokens(n: int):
    return _replace(num_actual_tokens=n, slot_mapping=lambda b: b.slot_mapping[:n],
                    positions=lambda b: b.positions[:n], token_to_req=lambda b: b.token_to_req[:n])


BATCH_DEFECTS = {
    "requests-over-capacity": (
        _replace(num_reqs=9), {}, CapacityError, ["num_reqs=9", "max_num_seqs=8"]),
    "tokens-over-capacity": (
        _replace(num_actual_tokens=65), {}, CapacityError,
        ["num_tokens=65", "max_num_batched_tokens=64"]),
    "max-seq-len-over-capacity": (
        _replace(max_seq_len=2000), {}, CapacityError, ["max_seq_len=2000", "max_model_len=1024"]),
    "count-not-an-int": (
        _replace(num_reqs=6.0), {}, InvalidBatchError, ["num_reqs must be an int", "6.0"]),
    "query-starts-not-zero-based": (
        _replace(query_start_loc_cpu=_cloned("query_start_loc_cpu", 0, 1)), {},
        InvalidBatchError, ["query_start_loc_cpu[0]=1", "must be 0"]),
    "query-starts-decrease": (
        _replace(query_start_loc_cpu=_cloned("query_start_loc_cpu", 2, 1)), {},
        InvalidBatchError, ["decreases at request 1: 2 -> 1", "non-decreasing"]),
    "tokens-dropped-by-padding": (
        _tokens(30), {}, InvalidBatchError,
        ["query_start_loc_cpu[num_reqs]=35", "num_actual_tokens=30"]),
    "wrong-dtype": (
        _replace(seq_lens_cpu=lambda b: b.seq_lens_cpu.long()), {}, InvalidBatchError,
        ["seq_lens_cpu has dtype torch.int64", "must be torch.int32"]),
    "wrong-device": (
        _replace(query_start_loc=torch.zeros(7, dtype=torch.int32, device="meta")), {},
        InvalidBatchError, ["query_start_loc is on meta", "must be on cpu"]),
    "wrong-rank": (
        _replace(block_table=lambda b: b.block_table.reshape(-1)), {}, InvalidBatchError,
        ["block_table has 1 dimensions", "must have 2"]),
    "wrong-shape": (
        _replace(seq_lens=lambda b: b.seq_lens[:5]), {}, InvalidBatchError,
        ["seq_lens has shape (5,)", "expected (6,)"]),
    "wrong-flag-dtype": (
        _replace(is_prefilling=torch.zeros(6, dtype=torch.int32)), {}, InvalidBatchError,
        ["is_prefilling has dtype torch.int32", "must be torch.bool"]),
    "block-table-too-narrow": (
        _replace(block_table=lambda b: b.block_table[:, :2]), {}, InvalidBatchError,
        ["block_table has 2 columns", "700 tokens", "cdiv(700, 256) = 3"]),
    "swa-table-missing": (
        _replace(swa_block_table=None), {}, InvalidBatchError,
        ["swa_block_table is missing", "sliding_window"]),
    "max-query-len-understated": (
        _replace(max_query_len=20), {}, InvalidBatchError,
        ["max_query_len=20", "longest query (30, request 3)"]),
    "max-seq-len-understated": (
        _replace(max_seq_len=600), {}, InvalidBatchError,
        ["max_seq_len=600", "longest sequence (700, request 3)"]),
    "query-longer-than-sequence": (
        _replace(seq_lens_cpu=_cloned("seq_lens_cpu", 3, 29)), {}, InvalidBatchError,
        ["schedules 30 tokens", "seq_lens[3]=29"]),
    "decode-after-prefill": (
        _replace(query_start_loc_cpu=torch.tensor([0, 30, 32, 33, 35, 35, 35],
                                                  dtype=torch.int32),
                 seq_lens_cpu=torch.tensor([700, 300, 50, 100, 0, 0], dtype=torch.int32)),
        dict(require_decode_first=True), InvalidBatchError,
        ["request 1 is a decode", "decode_threshold=2", "follows request 0"]),
    "block-id-out-of-range": (
        _replace(block_table=_cloned("block_table", (3, 2), 10**6)),
        dict(check_device_values=True, num_kv_blocks=NUM_BLOCKS), InvalidBatchError,
        ["block_table[3, 2]=1000000", "[0, 100000)"]),
    "negative-block-id": (
        _replace(swa_block_table=_cloned("swa_block_table", (0, 0), -4)),
        dict(check_device_values=True), InvalidBatchError,
        ["swa_block_table[0, 0]=-4", ">= 0"]),
    "device-lengths-disagree": (
        _replace(query_start_loc=_cloned("query_start_loc", 2, 5)),
        dict(check_device_values=True), InvalidBatchError,
        ["query_start_loc[2]=5 on the device", "query_start_loc_cpu[2]=4"]),
    "padded-token-writes-kv": (
        _replace(slot_mapping=_cloned("slot_mapping", 37, 5)),
        dict(check_device_values=True), InvalidBatchError,
        ["slot_mapping[37]=5", "query_start_loc_cpu[num_reqs]=35", "must be -1"]),
}


@pytest.mark.parametrize("name", list(BATCH_DEFECTS))
def test_batch_defect(staged, name):
    arena, _, _, batch = staged
    make_bad, options, error, fragments = BATCH_DEFECTS[name]
    bad = make_bad(batch)
    before = _snapshot(arena)
    with pytest.raises(error) as info:
        validate(bad, CONFIG, **options)
    assert type(info.value) is error
    for fragment in fragments:
        assert fragment in str(info.value)
    _assert_unchanged(arena, before)


def test_catalogue_size():
    assert len(HOST_DEFECTS) + len(BATCH_DEFECTS) >= 30


# ------------------------------------------------------------- device values stay unread
class _Spy(torch.Tensor):
    """Records every torch call on the tensor except shape / dtype / device queries."""

    calls: list[str] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", repr(func))
        if name not in ("__get__", "dim", "size"):
            cls.calls.append(name)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def test_device_values_are_read_only_when_asked(staged):
    _, _, _, batch = staged
    garbage = dataclasses.replace(
        batch,
        query_start_loc=torch.full_like(batch.query_start_loc, 99).as_subclass(_Spy),
        seq_lens=torch.full_like(batch.seq_lens, -5).as_subclass(_Spy),
        block_table=torch.full_like(batch.block_table, -7).as_subclass(_Spy),
        swa_block_table=torch.full_like(batch.swa_block_table, 10**9).as_subclass(_Spy),
        slot_mapping=torch.full_like(batch.slot_mapping, -9).as_subclass(_Spy),
    )
    _Spy.calls.clear()
    validate(garbage, CONFIG, require_decode_first=True, num_kv_blocks=NUM_BLOCKS)
    assert _Spy.calls == []
    with pytest.raises(InvalidBatchError):
        validate(garbage, CONFIG, num_kv_blocks=NUM_BLOCKS, check_device_values=True)
    assert "cpu" in _Spy.calls


# ------------------------------------------------------------------------ generated steps
MUTATIONS = ("none", "requests", "tokens", "negative_query", "negative_seq", "long_seq",
             "query_over_seq", "slot_count", "slot_below_pad", "decode_order")


@st.composite
def host_step_cases(draw):
    """A valid step (decodes first), then none or one defect of a host-checkable kind."""
    query_lens, seq_lens = [], []
    for _ in range(draw(st.integers(0, CONFIG.max_num_seqs))):
        q = draw(st.one_of(st.integers(0, 2), st.integers(3, 20)))
        if sum(query_lens) + q > CONFIG.max_num_batched_tokens:
            break
        query_lens.append(q)
        seq_lens.append(q + draw(st.integers(0, CONFIG.max_model_len - q)))
    order = sorted(range(len(query_lens)), key=lambda b: query_lens[b] > 2)
    query_lens = [query_lens[b] for b in order]
    seq_lens = [seq_lens[b] for b in order]
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    slots = [rng.choice([-1, 0, 17, 4000]) for _ in range(sum(query_lens))]
    mutation = draw(st.sampled_from(MUTATIONS))
    b = draw(st.integers(0, len(query_lens) - 1)) if query_lens else None
    if mutation == "requests":
        extra = CONFIG.max_num_seqs + 1 - len(query_lens)
        query_lens += [0] * extra
        seq_lens += [0] * extra
    elif mutation == "tokens":
        extra = CONFIG.max_num_batched_tokens + 1 - sum(query_lens)
        query_lens.append(extra)
        seq_lens.append(extra)
        slots += [-1] * extra
    elif mutation == "slot_count":
        slots = slots[:-1] if slots and draw(st.booleans()) else slots + [3]
    elif mutation == "slot_below_pad" and slots:
        slots[draw(st.integers(0, len(slots) - 1))] = -2
    elif mutation == "decode_order":
        query_lens.reverse()
        seq_lens.reverse()
    elif b is not None:
        if mutation == "negative_query":
            query_lens[b] = -1
        elif mutation == "negative_seq":
            seq_lens[b] = -1
        elif mutation == "long_seq":
            seq_lens[b] = CONFIG.max_model_len + draw(st.integers(1, 50))
        elif mutation == "query_over_seq" and query_lens[b] > 0:
            seq_lens[b] = query_lens[b] - 1
    return query_lens, seq_lens, slots, draw(st.booleans())


@settings(max_examples=2000)
@given(case=host_step_cases())
def test_host_step_matches_oracle(case):
    query_lens, seq_lens, slots, decode_first = case
    expected = oracle.host_step_errors(
        query_lens, seq_lens, slots, max_num_seqs=CONFIG.max_num_seqs,
        max_num_batched_tokens=CONFIG.max_num_batched_tokens,
        max_model_len=CONFIG.max_model_len, threshold=CONFIG.decode_threshold,
        require_decode_first=decode_first)
    args = (np.array(query_lens, dtype=np.int32), np.array(seq_lens, dtype=np.int32),
            np.array(slots, dtype=np.int64), CONFIG)
    if not expected:
        validate_host_step(*args, require_decode_first=decode_first)
        return
    with pytest.raises((CapacityError, InvalidBatchError)) as info:
        validate_host_step(*args, require_decode_first=decode_first)
    assert type(info.value).__name__ in expected


@pytest.fixture(scope="module")
def scratch_inputs():
    return make_arena(CONFIG)[1]


@settings(max_examples=300)
@given(step=host_steps(CONFIG))
def test_realistic_steps_are_valid(scratch_inputs, step):
    inputs = scratch_inputs
    validate_host_step(step.query_lens, step.seq_lens, step.slot_mapping, CONFIG,
                       num_reqs_padded=step.num_reqs_padded,
                       num_tokens_padded=step.num_tokens_padded, require_decode_first=True,
                       block_table=step.block_table, swa_block_table=step.swa_block_table,
                       num_kv_blocks=NUM_BLOCKS)
    batch = stage(inputs, step)
    validate(batch, CONFIG, require_decode_first=True, num_kv_blocks=NUM_BLOCKS,
             check_device_values=True)
