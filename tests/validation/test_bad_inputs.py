"""Catalogue of bad inputs across the public API.

Each gets its documented typed error, with a message naming the limit; afterwards the arena
fingerprint is unchanged, the arena's contents from the last good step are unchanged, and
the next good step still runs (replays, on a GPU) and matches the eager path.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.support import DEVICE, quiet

from staticattn.arena import Arena, ArenaConfig, BufferDecl
from staticattn.builders import make_arena
from staticattn.builders.indexer.builder import IndexerMetadataBuilder
from staticattn.builders.swa.builder import SparseSWAMetadataBuilder
from staticattn.consumers.emulated.gather import GatherConsumer
from staticattn.errors import (
    ArenaError,
    CapacityError,
    ConfigError,
    GraphError,
    InvalidBatchError,
    StaticAttnError,
)
from staticattn.graphs import GraphManager, normalize_capture_sizes

CUDA = torch.cuda.is_available()


def _cfg(**kw):
    base = dict(max_num_seqs=16, max_num_batched_tokens=128, max_model_len=4096, device=DEVICE)
    base.update(kw)
    return ArenaConfig.deepseek_v4(**base)


# (label, callable, error type, a fragment the message must contain)
CONFIGS = [
    ("zero max_num_seqs", lambda: _cfg(max_num_seqs=0), ConfigError, "max_num_seqs=0"),
    ("block size vs ratio", lambda: _cfg(block_size=100), ConfigError, "multiple"),
    ("unsupported ratio", lambda: _cfg(compress_ratios=(1, 8)), ConfigError,
     "layer 1: compress ratio 8 is not a deepseek_v4 layer type"),
    ("unknown architecture", lambda: _cfg(architecture="llama"), ConfigError, "deepseek_v4"),
    ("V4 ratios without window", lambda: _cfg(sliding_window=None), ConfigError, "sliding_window"),
    ("zero window", lambda: _cfg(sliding_window=0), ConfigError, ">= 1"),
    ("unknown device", lambda: _cfg(device="tpu"), ConfigError, "device"),
    ("unknown backend", lambda: _cfg(kernel_backend="cuda"), ConfigError, "kernel_backend"),
    ("native path with next_n 3", lambda: _cfg(num_speculative_tokens=2, use_flattening=False),
     ConfigError, "(1, 2)"),
    ("negative drafts", lambda: _cfg(num_speculative_tokens=-1), ConfigError, "[0, 15]"),
    ("next_n over token budget", lambda: _cfg(max_num_batched_tokens=1), ConfigError,
     "max_num_batched_tokens=1"),
    ("tiny logits budget", lambda: _cfg(max_logits_bytes=2), ConfigError, "(4)"),
    ("context shorter than a block", lambda: _cfg(max_model_len=7), ConfigError,
     "max_model_len=7 is below block_size=256"),
    ("context shorter than an SWA block",
     lambda: _cfg(max_model_len=32, block_size=16, compress_ratios=(1, 4), swa_block_size=64),
     ConfigError, "below swa_block_size=64"),
    ("context shorter than a decode step",
     lambda: ArenaConfig.deepseek_v32(max_model_len=2, block_size=1, num_speculative_tokens=2,
                                      device=DEVICE), ConfigError, "below next_n=3"),
    ("positions past int32", lambda: _cfg(max_model_len=2**40), ConfigError, "2**31 - 1"),
    ("block table past int32 offsets",
     lambda: ArenaConfig.deepseek_v32(max_model_len=2**31 - 64, device=DEVICE), ConfigError,
     "(the block table)"),
    ("dense rows past int32 offsets",
     lambda: _cfg(max_num_batched_tokens=2**20, max_model_len=2**24), ConfigError,
     "(the dense type's index rows)"),
    ("prefill workspace past int32", lambda: _cfg(max_prefill_workspace=2**31), ConfigError,
     "max_prefill_workspace"),
    ("logits budget past int32", lambda: _cfg(max_logits_bytes=2**33), ConfigError,
     "max_logits_bytes // 4"),
    ("unknown preset", lambda: ArenaConfig.preset("llama"), ConfigError, "deepseek-v4"),
    ("SWA builder without window",
     lambda: SparseSWAMetadataBuilder().buffers(ArenaConfig.deepseek_v32(device=DEVICE)),
     ConfigError, "sliding_window"),
]

# (label, (query_lens, seq_lens, slot_mapping), error type, message fragment)
BATCHES = [
    ("too many requests", ([2] * 17, [9] * 17, [0] * 34), CapacityError, "max_num_seqs=16"),
    ("too many tokens", ([64, 66], [80, 80], [0] * 130), CapacityError,
     "max_num_batched_tokens=128"),
    ("sequence over max_model_len", ([2], [5000], [0, 1]), CapacityError, "max_model_len=4096"),
    ("negative query length", ([2, -1], [9, 9], [0]), InvalidBatchError, "negative"),
    ("query longer than sequence", ([2, 5], [9, 3], [0] * 7), InvalidBatchError, "seq"),
    ("slot count mismatch", ([2, 2], [9, 9], [0, 1, 2]), InvalidBatchError, "slot"),
    ("seq_lens count mismatch", ([2, 2], [9], [0, 1, 2, 3]), InvalidBatchError, "seq_lens"),
    ("prefill before decode", ([6, 2], [9, 9], [0] * 8), InvalidBatchError, "decode-first"),
    ("float lengths", ([2.5], [9.0], [0, 1]), InvalidBatchError, "int"),
    ("2-D query lengths", ([[2]], [[9]], [0, 1]), InvalidBatchError, "1-D"),
    ("negative sequence length", ([0, 2], [-1, 9], [0, 1]), InvalidBatchError, "negative"),
    ("slot below -1", ([2], [9], [0, -5]), InvalidBatchError, "-1"),
    ("step with no request", ([], [], []), InvalidBatchError, "at least one request"),
    # The manager knows the pool (num_kv_blocks): both replay pre-screens check the bound.
    ("decode slot beyond the KV pool", ([2, 2], [9, 9], [0, 1, 2, 10**6]), InvalidBatchError,
     "the KV pool has"),
    ("mixed slot beyond the KV pool", ([1, 3], [9, 9], [0, 1, 2, 10**6]), InvalidBatchError,
     "the KV pool has"),
]


@pytest.fixture(scope="module")
def world():
    cfg = _cfg()
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    step = GatherConsumer(cfg, num_kv_blocks=512)
    gm = GraphManager(arena, inputs, builders, step,
                      quiet(num_kv_blocks=512))
    if CUDA:
        gm.capture([2, 8])
    good = (np.array([2, 2]), np.array([300, 2000]), np.array([5, 6, 70, 71]))
    rows = torch.randint(1, 512, (16, cfg.max_swa_blocks_per_req), dtype=torch.int32)
    inputs.swa_block_table.copy_(rows.to(inputs.swa_block_table.device))
    inputs.block_table.copy_(rows[:, : cfg.max_blocks_per_req].to(inputs.block_table.device))
    yield cfg, arena, inputs, gm, good
    gm.close()


def _snapshot(arena):
    return {n: arena[n].clone() for n in arena.names()}


def _good_step_still_works(gm, good, last_outputs):
    res = gm.run(*good)
    assert res.mode == ("graph" if CUDA else "eager")
    out = res.outputs.clone()
    assert torch.equal(out, last_outputs)
    assert torch.equal(out, gm.run_eager(*good))


def _after_bad(world, fn, err, fragment):
    cfg, arena, inputs, gm, good = world
    last = gm.run(*good).outputs.clone()
    fingerprint, contents = arena.fingerprint(), _snapshot(arena)
    with pytest.raises(err) as info:
        fn()
    assert isinstance(info.value, StaticAttnError)
    assert fragment in str(info.value), str(info.value)
    assert arena.fingerprint() == fingerprint
    for name, before in contents.items():
        assert torch.equal(arena[name], before), f"{name} changed after a rejected input"
    _good_step_still_works(gm, good, last)


@pytest.mark.parametrize("label, make, err, fragment", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_bad_config(world, label, make, err, fragment):
    _after_bad(world, make, err, fragment)


@pytest.mark.parametrize("label, batch, err, fragment", BATCHES, ids=[b[0] for b in BATCHES])
def test_bad_batch(world, label, batch, err, fragment):
    gm = world[3]
    q, s, slots = (np.array(x) for x in batch)
    _after_bad(world, lambda: gm.run(q, s, slots), err, fragment)


def test_bad_capture_sizes(world):
    cfg = world[0]
    for sizes, fragment in (([3], "multiple of next_n"), ([], "empty"), ([4096], "exceeds")):
        _after_bad(world, lambda sizes=sizes: normalize_capture_sizes(cfg, sizes), GraphError,
                   fragment)


def test_misuse(world):
    cfg, arena, inputs, gm, good = world
    _after_bad(world, lambda: arena.declare(BufferDecl("late", (1,), torch.int32)), ArenaError,
               "already allocated")
    _after_bad(world, lambda: arena["no.such.buffer"], ArenaError, "unknown buffer")
    _after_bad(world, lambda: arena.allocate(), ArenaError, "already called")
    _after_bad(world, lambda: make_arena(cfg, [IndexerMetadataBuilder(), IndexerMetadataBuilder()]),
               ArenaError, "unique")
    _after_bad(world, lambda: gm.graph_for(6), GraphError, "was captured")
    fresh = Arena(cfg)
    _after_bad(world, lambda: fresh["x"], ArenaError, "before allocate")


def test_closed_manager_refuses(world):
    cfg, arena, inputs, gm, good = world
    other = GraphManager(arena, inputs, gm.builders, gm.step, quiet())
    other.close()
    _after_bad(world, lambda: other.run(*good), GraphError, "closed")
    _after_bad(world, lambda: other.capture([2]), GraphError, "closed")


@pytest.mark.gpu
def test_step_that_breaks_capture_is_a_graph_error_and_leaves_the_rest_usable(world):
    cfg, arena, inputs, gm, good = world

    def syncing_step(batch, md):
        out = gm.step(batch, md)
        if int(out.sum().item()) < 0:  # a host read: not capturable
            out.zero_()
        return out

    bad = GraphManager(arena, inputs, gm.builders, syncing_step, quiet())
    current = torch.cuda.current_stream()
    _after_bad(world, lambda: bad.capture([4], buckets=()), GraphError,
               "capturing the decode graph of 4 tokens failed")
    # The failed capture gives the current stream back: reading a replay's outputs on the
    # capture stream would race the replay stream.
    assert torch.cuda.current_stream() == current
    bad.close()


@pytest.mark.skipif(CUDA, reason="CPU arenas only")
def test_capture_on_cpu_is_a_graph_error(world):
    gm = world[3]
    _after_bad(world, lambda: gm.capture([2]), GraphError, "CUDA")


# -------------------------------------------------------------------- in-place API
def _write_decode(views, seq_lens, slots):
    views.seq_lens[: len(seq_lens)] = seq_lens
    views.slot_mapping[: len(slots)] = slots


IN_PLACE = [
    # (label, (num_reqs, num_tokens or None), seq_lens, slots, query starts, error, fragment)
    ("negative length", (2, None), [-3, 9], [0, 1, 2, 3], None, InvalidBatchError,
     "seq_lens[0]=-3 is negative"),
    ("length over max_model_len", (2, None), [9, 5000], [0, 1, 2, 3], None, CapacityError,
     "exceeds max_model_len"),
    ("slot below -1", (2, None), [9, 9], [0, -7, 2, 3], None, InvalidBatchError, "-1"),
    ("too many requests", (17, None), [9] * 16, list(range(32)), None, CapacityError,
     "max_num_seqs"),
    ("no request", (0, None), [], [], None, InvalidBatchError, "at least one request"),
    ("query starts not ending at the tokens", (2, 5), [9, 9], [0, 1, 2, 3, 4], [0, 2, 4],
     InvalidBatchError, "query_start_loc"),
    ("decreasing query starts", (3, 5), [9, 9, 9], [0, 1, 2, 3, 4], [0, 3, 1, 5],
     InvalidBatchError, "decreases"),
    ("query longer than its sequence", (2, 6), [2, 3], list(range(6)), [0, 2, 6],
     InvalidBatchError, "more than its sequence"),
    ("tokens over capacity", (2, 200), [9, 9], [0, 1], [0, 2, 200], CapacityError,
     "max_num_batched_tokens"),
    ("decode slot beyond the KV pool", (2, None), [9, 9], [0, 1, 2, 10**6], None,
     InvalidBatchError, "the KV pool has"),
    ("mixed slot beyond the KV pool", (2, 4), [9, 9], [0, 1, 2, 10**6], [0, 1, 4],
     InvalidBatchError, "the KV pool has"),
]


@pytest.mark.parametrize("label, counts, seq_lens, slots, qsl, err, fragment", IN_PLACE,
                         ids=[c[0] for c in IN_PLACE])
def test_bad_in_place_step(world, label, counts, seq_lens, slots, qsl, err, fragment):
    """The engine wrote a bad step into the views: launch() raises before launching or
    writing anything of its own, and the next good step replays."""
    cfg, arena, inputs, gm, good = world
    views = gm.begin_step()
    _write_decode(views, seq_lens, slots)
    if qsl is not None:
        views.query_start_loc[: len(qsl)] = qsl
    device_before = arena.block("device").clone()
    host_before = arena.block("host").clone()
    with pytest.raises(err) as info:
        gm.launch(*[c for c in counts if c is not None])
    assert fragment in str(info.value), str(info.value)
    if CUDA:
        torch.cuda.synchronize()
    assert torch.equal(arena.block("device"), device_before)
    assert torch.equal(arena.block("host"), host_before)
    _good_step_still_works(gm, good, gm.run_eager(*good).clone())
