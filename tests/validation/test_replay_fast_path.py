"""The replay path's shortcuts agree with the general ones: the pre-screens never clear a
step the full validator rejects (and the in-place view checks reject exactly the steps a
plain check from the definition rejects), and uniform staging writes what stage()
writes."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from helpers.support import quiet
from hypothesis import given, settings
from hypothesis import strategies as st

from staticattn.arena import ArenaConfig
from staticattn.builders import make_arena
from staticattn.errors import CapacityError, InvalidBatchError
from staticattn.validation.host_arrays import (
    screen_step,
    uniform_decode_passes,
    validate_host_step,
)
from staticattn.validation.in_place_views import ViewChecks
from staticattn.validation.values import slot_bound

#: Examples per property: host-only checks, drawn in the hundreds (the strategies are
#: small: these counts cover their corners).
EXAMPLES = 600

# Short sequences and small blocks (a V4 block is 256 tokens, longer than the whole range).
CFG = ArenaConfig.deepseek_v32(max_num_seqs=8, max_num_batched_tokens=16, max_model_len=64,
                               block_size=16, num_speculative_tokens=1, device="cpu")


@settings(max_examples=EXAMPLES)
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


@pytest.mark.parametrize("slot", [2**63, 2**64 - 2])
def test_unsigned_slots_past_int64_never_pass_a_screen(slot):
    """Without a pool size the screens still bound unsigned slots by int64, the staging's
    dtype: staged, ``2**64 - 2`` would read as -2."""
    k, n = 2, CFG.next_n
    q, s = np.full(k, n), np.full(k, 10)
    slots = np.arange(k * n, dtype=np.uint64)
    slots[1] = slot
    assert not uniform_decode_passes(k, s, slots, CFG)
    assert screen_step(q, s, slots, CFG) is None
    with pytest.raises(InvalidBatchError):
        validate_host_step(q, s, slots, CFG, require_decode_first=True,
                           decode_threshold=CFG.decode_threshold)


INT32 = (-(2**31), 2**31 - 1)


@settings(max_examples=EXAMPLES)
@given(
    q=st.lists(st.integers(1, 6), min_size=1, max_size=8),
    extra=st.lists(st.integers(0, 60), min_size=8, max_size=8),
    slot_values=st.lists(st.integers(-1, 499), min_size=48, max_size=48),
    ordered=st.booleans(),
    plants=st.lists(st.tuples(st.sampled_from(("q", "s", "slots")), st.integers(0, 47),
                              st.one_of(st.integers(-3, 80), st.sampled_from(INT32))),
                    max_size=2),
    dtypes=st.sampled_from([(np.int32, np.int32), (np.int64, np.int32), (np.uint32, np.int64),
                            (np.int32, np.uint32)]),
    blocks=st.sampled_from([None, 2, 7]),
)
def test_step_screen_implies_full_validation(q, extra, slot_values, ordered, plants, dtypes,
                                             blocks):
    """Steps that start valid-looking, with up to two planted values (int32 extremes,
    where a subtraction wraps around, included), as signed and unsigned arrays: a step the
    screen clears passes the full check, and the screen's lengths are the step's shortest
    and longest query."""
    if ordered:  # decode-first
        q = sorted(q, key=lambda x: x > CFG.decode_threshold)
    fields = {"q": q, "s": [a + b for a, b in zip(q, extra)],
              "slots": slot_values[: sum(q)]}
    for field, index, value in plants:
        values = fields[field]
        if values:
            values[index % len(values)] = value
    qa = np.asarray(fields["q"], dtype=np.int64).astype(dtypes[0])
    sa = np.asarray(fields["s"], dtype=np.int64).astype(dtypes[1])
    sl = np.asarray(fields["slots"], dtype=np.int64)
    lengths = screen_step(qa, sa, sl, CFG, slot_bound(CFG, blocks, None))
    if lengths is not None:
        validate_host_step(qa, sa, sl, CFG, require_decode_first=True,
                           decode_threshold=CFG.decode_threshold, num_kv_blocks=blocks)
        assert lengths == (int(qa.min()), int(qa.max()))


def _views_valid(qsl, seq, slots, k, t, bound) -> bool:
    """The in-place contract, from its definition: counts within capacity, query starts
    from 0 to ``t``, each query within ``[0, L]``, ``0 <= L <= max_model_len``, slots in
    ``[-1, bound)``."""
    if not (0 < k <= CFG.max_num_seqs and 0 <= t <= CFG.max_num_batched_tokens):
        return False
    if qsl[0] != 0 or qsl[k] != t:
        return False
    for i in range(k):
        q = qsl[i + 1] - qsl[i]
        if not (0 <= q <= seq[i] and seq[i] <= CFG.max_model_len):
            return False
    return all(-1 <= x and (bound is None or x < bound) for x in slots[:t])


FIELDS = ("starts", "seq", "slots")


@settings(max_examples=EXAMPLES)
@given(
    k=st.integers(1, 8),
    steps=st.lists(st.integers(0, 4), min_size=8, max_size=8),
    seq=st.lists(st.integers(0, 70), min_size=8, max_size=8),
    slots=st.lists(st.integers(-1, 499), min_size=16, max_size=16),
    plants=st.lists(st.tuples(st.sampled_from(FIELDS), st.integers(0, 15),
                              st.one_of(st.integers(-3, 80), st.sampled_from(INT32))),
                    max_size=2),
    bound=st.sampled_from([None, 500]),
)
def test_view_checks_reject_exactly_the_invalid_steps(k, steps, seq, slots, plants, bound):
    """``ViewChecks`` on views an engine wrote: a typed error exactly when the plain check
    from the definition fails. Steps start valid-looking and get up to two planted values
    (int32 extremes, where a difference wraps around, included)."""
    _, inputs = make_arena(CFG, [])
    host = inputs.host
    fields = {"starts": [0, *np.cumsum(steps).tolist()], "seq": seq, "slots": slots}
    for field, index, value in plants:
        values = fields[field]
        values[index % len(values)] = value
    qsl, seq, slots = fields["starts"], fields["seq"], fields["slots"]
    t = qsl[k] if 0 <= qsl[k] <= 16 else 16
    host.query_start_loc[:9] = qsl
    host.seq_lens[:8] = seq
    host.slot_mapping[:16] = slots
    checks = ViewChecks(host, CFG, bound)
    if _views_valid(qsl, seq, slots, k, t, bound):
        checks.step(k, t)
    else:
        with pytest.raises((InvalidBatchError, CapacityError)):
            checks.step(k, t)
    # A uniform decode step's sequences hold its next_n tokens (L >= next_n).
    decode_ok = all(CFG.next_n <= x <= CFG.max_model_len for x in seq[:k]) and all(
        -1 <= x and (bound is None or x < bound) for x in slots[: k * CFG.next_n])
    if decode_ok:
        checks.decode(k)
    else:
        with pytest.raises((InvalidBatchError, CapacityError)):
            checks.decode(k)


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


@functools.cache
def _manager():
    from helpers.toy import ToyBuilder

    from staticattn.graphs import GraphManager

    b = ToyBuilder()
    arena, inputs = make_arena(CFG, [b])
    return GraphManager(arena, inputs, [b], lambda batch, md: None, quiet())


_INT_DTYPES = [np.dtype(t).newbyteorder(order) for t in
               (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
                np.uint64) for order in ("<", ">")]


@settings(max_examples=EXAMPLES)
@given(
    k=st.integers(1, 8),
    plants=st.lists(st.tuples(st.integers(0, 7), st.integers(-(2**63), 2**64 - 1)),
                    max_size=2),
    dtype=st.sampled_from(_INT_DTYPES),
)
def test_the_uniform_decode_test_is_exactly_all_queries_next_n(k, plants, dtype):
    """run() tells a uniform decode step by comparing the query lengths' bytes with those
    of ``k`` times ``next_n`` in their dtype: true exactly when every length is
    ``next_n``, in either byte order, whatever the planted values."""
    gm = _manager()
    info = np.iinfo(dtype)
    values = [CFG.next_n] * k
    for i, v in plants:
        values[i % k] = min(max(v, info.min), info.max)
    q = np.array(values, dtype=dtype)
    assert (q.tobytes() == gm.runner._decode_query(k, q.dtype)) == bool((q == CFG.next_n).all())
