"""The sparse-MLA decode consumer (DeepSeek V3.2, FlashMLA's sparse FP8 decode
``flash_mla_with_kvcache(..., indices=...)``: emulated in torch on CPU, the real kernel on
CUDA where FlashMLA is built): every decode token of a step gets the oracle's attention (per
token, its top-k key positions read from the ``fp8_ds_mla`` cache through the block table),
whichever build made the indexer metadata -- the eager build (native decode rows, ``width``
MTP tokens a row) or a token bucket's mixed build (the split on the device, MTP flattened)
-- with top-k rows padded with -1 and naming positions past the token; the prefill tokens'
rows are left alone; what the sm90 kernel does not serve is refused before anything is
made."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from helpers.mixed_steps import bucket_for, stage_mixed
from helpers.sparse_mla_reference import (
    UNTOUCHED,
    emulated_sparse_decode,
    kernel_abs_tol,
    oracle_attention,
    served_row_problems,
)
from helpers.sparse_mla_steps import DEVICES, new_inputs, tiled_cache
from helpers.support import host_steps, make_step, stage
from hypothesis import given, settings

from staticattn.arena import ArenaConfig
from staticattn.builders import IndexerMetadataBuilder, make_arena
from staticattn.builders.swa.tile_scheduler import TileSchedulerMeta
from staticattn.consumers.real.caches import alloc_ds_mla_cache
from staticattn.consumers.real.sparse_mla_decode import SparseMLADecode
from staticattn.errors import ConfigError, InvalidBatchError

BLOCKS = 64
HEADS = 64
#: Plain decode with a top-k of 128; MTP (next_n = 2) with FlashMLA's smallest, 64.
MODELS = {"next_n=1": (0, 128), "mtp-2": (1, 64)}


def _config(device: str = "cpu", spec: int = 0, **kw) -> ArenaConfig:
    base = dict(max_model_len=1024, max_num_seqs=8, max_num_batched_tokens=64,
                max_prefill_workspace=1100, max_logits_bytes=120_000, index_topk=128,
                num_speculative_tokens=spec, device=device,
                kernel_backend="torch" if device == "cpu" else "auto")
    return ArenaConfig.deepseek_v32(**{**base, **kw})


@dataclasses.dataclass
class World:
    config: ArenaConfig
    builder: IndexerMetadataBuilder
    inputs: object
    cache: torch.Tensor
    q: torch.Tensor
    consumer: SparseMLADecode


def _world(cfg: ArenaConfig, topk: int) -> World:
    builder = IndexerMetadataBuilder()
    _, inputs = make_arena(cfg, [builder])
    dev = cfg.torch_device
    cache = tiled_cache(BLOCKS, dev)
    q = torch.zeros(cfg.max_num_batched_tokens, HEADS, 576, dtype=torch.bfloat16, device=dev)
    emulated = dev.type == "cpu"
    consumer = SparseMLADecode(cfg, kv_cache=cache, q=q, topk=topk,
                               decode_fn=emulated_sparse_decode if emulated else None,
                               plan_fn=TileSchedulerMeta if emulated else None)
    return World(cfg, builder, inputs, cache, q, consumer)


def _check(w: World, s, build: str,
           bucket: tuple[int, int] | None = None) -> tuple[int, np.ndarray]:
    """Attend the step ``s`` through ``build`` (``"build"``: eager; ``"build_mixed"``: in a
    token bucket of ``bucket``, default :func:`bucket_for`'s); assert every decode token's
    row is the oracle's and every other row untouched. Returns the decode tokens and the
    step's top-k rows."""
    topk = new_inputs(w.q, s, w.consumer.topk, s.num_tokens)
    if build == "build":
        batch = stage(w.inputs, dataclasses.replace(s, num_reqs_padded=s.num_reqs,
                                                    num_tokens_padded=s.num_tokens))
    else:
        r, t = bucket or bucket_for(w.config, s.num_tokens, np.random.default_rng(s.num_tokens))
        batch = stage_mixed(w.inputs, s, r, t)
    idx_md = getattr(w.builder, build)(batch)
    t = batch.num_actual_tokens
    dev = w.q.device
    rows = torch.full((t, w.consumer.topk), -1, dtype=torch.int32, device=dev)
    rows[: s.num_tokens] = torch.from_numpy(topk).to(dev)
    out = torch.full((t, HEADS, 512), UNTOUCHED, dtype=torch.bfloat16, device=dev)
    w.consumer.attend_into(idx_md, rows, out)
    td = int(idx_md.step_counts[3]) if build == "build_mixed" else idx_md.num_decode_tokens
    ref = oracle_attention(w.q.cpu(), w.cache.cpu(), s.block_table, s.query_lens, s.seq_lens,
                           topk, w.consumer.scale, tokens=td)
    tol = kernel_abs_tol(dev, w.cache, s.block_table, s.query_lens, s.seq_lens, topk)
    assert served_row_problems(out.cpu(), ref, torch.arange(out.shape[0]) < td, tol[:td]) == []
    return td, topk


def _table(s):
    """The step with block ids in ``[1, BLOCKS)``, the cache's pages."""
    return dataclasses.replace(s, block_table=s.block_table % (BLOCKS - 1) + 1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model", list(MODELS))
def test_every_decode_token_of_drawn_steps_gets_the_oracle_attention(model, device):
    spec, topk = MODELS[model]
    cfg = _config(device, spec)
    w = _world(cfg, topk)
    seen = {"decode tokens": 0, "padded": 0, "past": 0}

    @settings(max_examples=4, deadline=None)
    @given(host_steps(cfg, kinds=("uniform_decode", "decode", "mixed"),
                      max_seq_len=cfg.max_model_len))
    def check(s):
        s = _table(s)
        for build in ("build", "build_mixed"):
            td, rows = _check(w, s, build)
        rows = rows[:td]
        pos = np.concatenate([np.arange(n - q, n) for q, n in zip(s.query_lens, s.seq_lens)])
        seen["decode tokens"] += td
        seen["padded"] += int(((rows < 0).any(1) & (rows >= 0).any(1)).sum())
        seen["past"] += int((rows > pos[:td, None]).any(1).sum())

    check()
    assert all(seen.values()), seen


#: (query lengths, sequence lengths): decodes first, then prefills. Keys of one page, of
#: two, up to the longest; MTP rows whose first token must not see the second's key.
STEPS = {
    "next_n=1": [([1, 1, 1, 1], [1, 64, 65, 1000]),
                 ([1, 1, 40, 20], [9, 1000, 40, 300])],
    "mtp-2": [([2, 2, 2], [2, 130, 700]),
              ([2, 1, 2, 30, 20], [66, 1, 400, 30, 500])],
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("build", ["build", "build_mixed"])
@pytest.mark.parametrize("model", list(MODELS))
def test_decode_rows_of_set_steps(model, build, device):
    """Fixed steps for both layouts: the eager MTP build's native rows of two tokens, the
    mixed build's flattened ones, a bucket with more rows than the step."""
    spec, topk = MODELS[model]
    cfg = _config(device, spec)
    w = _world(cfg, topk)
    for i, (query_lens, seq_lens) in enumerate(STEPS[model]):
        s = make_step(cfg, query_lens, seq_lens, rng=np.random.default_rng(i),
                      num_blocks=BLOCKS)
        assert _check(w, s, build, bucket=(8, 64))[0] > 0


def test_each_call_plans_its_own_tile_schedule():
    """A holder per call (FlashMLA would reuse a planned holder's schedule, and asserts the
    batch shape it was planned for): two steps of different decode counts in a row."""
    cfg = _config()
    w = _world(cfg, 128)
    made = []

    def plan():
        made.append(TileSchedulerMeta())
        return made[-1]

    w.consumer.plan_fn = plan
    for i, (query_lens, seq_lens) in enumerate([([1, 1, 1], [5, 70, 300]), ([1], [9])]):
        _check(w, make_step(cfg, query_lens, seq_lens, rng=np.random.default_rng(i),
                            num_blocks=BLOCKS), "build")
    assert [h.config[0] for h in made] == [3, 1]


def test_padded_native_rows_are_refused():
    """An eager build of a padded decode step has native rows of unequal query lengths; the
    consumer would read the wrong row for the tokens after the padding."""
    cfg = _config()
    w = _world(cfg, 128)
    s = make_step(cfg, [1, 1, 0], [5, 9, 0], num_blocks=BLOCKS)
    md = w.builder.build(stage(w.inputs, s))
    rows = torch.full((3, 128), -1, dtype=torch.int32)
    with pytest.raises(InvalidBatchError, match="unequal query lengths"):
        w.consumer.attend_into(md, rows, torch.zeros(3, HEADS, 512, dtype=torch.bfloat16))


def _make(cfg: ArenaConfig, *, heads: int = HEADS, topk: int = 128, dim: int = 576,
          cache: torch.Tensor | None = None) -> SparseMLADecode:
    q = torch.zeros(cfg.max_num_batched_tokens, heads, dim, dtype=torch.bfloat16)
    return SparseMLADecode(cfg, kv_cache=alloc_ds_mla_cache(2, "cpu") if cache is None
                           else cache, q=q, topk=topk, decode_fn=emulated_sparse_decode,
                           plan_fn=TileSchedulerMeta)


def _v4() -> ArenaConfig:
    return ArenaConfig.deepseek_v4(max_model_len=1024, max_num_seqs=8,
                                   max_num_batched_tokens=64, device="cpu")


#: By case: the config (``_config``'s fields, or a V4 config), ``_make``'s arguments and
#: what the message says.
REFUSED = {
    "v4": (_v4, {}, "V3.2's layout"),
    "block-128": (dict(block_size=128), {}, "V3.2's layout"),
    "heads-32": ({}, dict(heads=32), r"takes \(64, 128\)"),
    "heads-192": ({}, dict(heads=192), r"takes \(64, 128\)"),
    "head-dim": ({}, dict(dim=512), "d_qk = 576"),
    "topk": ({}, dict(topk=96), "multiple of 64"),
    "cache-bytes": ({}, dict(cache=torch.zeros(2, 64, 1, 584, dtype=torch.uint8)), "fp8_ds_mla"),
    "cache-page": ({}, dict(cache=torch.zeros(2, 32, 1, 656, dtype=torch.uint8)), "fp8_ds_mla"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_the_sm90_decode_does_not_serve_is_refused(case):
    config, kw, match = REFUSED[case]
    cfg = config() if callable(config) else _config(**config)
    with pytest.raises(ConfigError, match=match):
        _make(cfg, **kw)
