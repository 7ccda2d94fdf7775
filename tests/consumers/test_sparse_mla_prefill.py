"""The sparse-MLA prefill consumer (DeepSeek V3.2, FlashMLA's ``flash_mla_sparse_fwd``:
emulated in torch on CPU, the real kernel on CUDA where FlashMLA is built): every prefill
token of a mixed step gets the oracle's attention (per token, its top-k key positions read
from the ``fp8_ds_mla`` cache through the block table), whichever build made the indexer
metadata -- the eager build's host-planned chunks, or a token bucket's device plan run at
fixed shapes -- including steps whose keys overflow one chunk; the decode tokens' rows are
left alone; what the sm90 kernel does not serve is a ``ConfigError`` before anything is
made."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from helpers.mixed_steps import bucket_for, stage_mixed
from helpers.sparse_mla_reference import (
    UNTOUCHED,
    dequant_ds_mla_cache,
    emulated_sparse_fwd,
    kernel_abs_tol,
    oracle_attention,
    served_row_problems,
)
from helpers.sparse_mla_steps import DEVICES, new_inputs, tiled_cache
from helpers.support import host_steps, make_step, stage
from hypothesis import given, settings

from staticattn.arena import ArenaConfig
from staticattn.builders import IndexerMetadataBuilder, make_arena
from staticattn.consumers.real.caches import alloc_ds_mla_cache, write_ds_mla_cache
from staticattn.consumers.real.sparse_mla_prefill import SparseMLAPrefill
from staticattn.errors import ConfigError

BLOCKS = 64
HEADS = 64
TOPK = 128


def _config(device: str = "cpu", **kw) -> ArenaConfig:
    base = dict(max_model_len=1024, max_num_seqs=8, max_num_batched_tokens=128,
                max_prefill_workspace=1100, max_logits_bytes=120_000, index_topk=TOPK,
                device=device, kernel_backend="torch" if device == "cpu" else "auto")
    return ArenaConfig.deepseek_v32(**{**base, **kw})


@dataclasses.dataclass
class World:
    builders: list
    inputs: object
    cache: torch.Tensor
    q: torch.Tensor
    consumer: SparseMLAPrefill
    consumer_config: ArenaConfig


def _world(cfg: ArenaConfig) -> World:
    builders = [IndexerMetadataBuilder()]
    _, inputs = make_arena(cfg, builders)
    dev = cfg.torch_device
    cache = tiled_cache(BLOCKS, dev)
    q = torch.zeros(cfg.max_num_batched_tokens, HEADS, 576, dtype=torch.bfloat16, device=dev)
    consumer = SparseMLAPrefill(cfg, kv_cache=cache, q=q, topk=TOPK,
                                sparse_fwd_fn=emulated_sparse_fwd if dev.type == "cpu"
                                else None)
    return World(builders, inputs, cache, q, consumer, cfg)


def _attend(w: World, batch, build: str, topk: np.ndarray) -> tuple[torch.Tensor, object]:
    """The step's output rows (bf16 ``(T, H, 512)``, :data:`UNTOUCHED` where not written)
    and its indexer metadata."""
    md = {b.name: getattr(b, build)(batch) for b in w.builders}
    t = batch.num_actual_tokens
    dev = w.q.device
    rows = torch.full((t, TOPK), -1, dtype=torch.int32, device=dev)
    rows[: topk.shape[0]] = torch.from_numpy(topk).to(dev)
    out = torch.full((t, HEADS, 512), UNTOUCHED, dtype=torch.bfloat16, device=dev)
    w.consumer.attend_into(md["indexer"], rows, out)
    return out, md["indexer"]


def _decode_tokens(cfg: ArenaConfig, s) -> int:
    """The step's decode tokens: those of its requests of at most ``next_n`` tokens (the
    first ones)."""
    q = np.asarray(s.query_lens)
    return int(q[q <= cfg.next_n].sum())


def _problems(w: World, s, out: torch.Tensor, topk: np.ndarray) -> list[str]:
    """The prefill tokens' rows against the oracle; the other rows (the decode tokens',
    and the bucket's padding past the step) untouched."""
    ref = oracle_attention(w.q.cpu(), w.cache.cpu(), s.block_table, s.query_lens,
                           s.seq_lens, topk, w.consumer.scale)
    tol = kernel_abs_tol(w.q.device, w.cache, s.block_table, s.query_lens, s.seq_lens, topk)
    td, t = _decode_tokens(w.consumer_config, s), ref.shape[0]
    rows = torch.arange(out.shape[0])
    return served_row_problems(out.cpu(), ref[td:], (rows >= td) & (rows < t), tol[td:])


@pytest.mark.parametrize("device", DEVICES)
def test_every_prefill_token_of_mixed_steps_gets_the_oracle_attention(device):
    cfg = _config(device)
    w = _world(cfg)
    shapes = {"padded": 0, "short": 0}  # top-k rows with -1 padding; tokens with < K keys

    # The oracle is a loop per token: fewer steps where the emulation runs too.
    @settings(max_examples=4 if device == "cpu" else 10, deadline=None)
    @given(host_steps(cfg, kinds=("mixed",), max_seq_len=cfg.max_model_len))
    def check(s):
        s = dataclasses.replace(s, block_table=s.block_table % (BLOCKS - 1) + 1)
        topk = new_inputs(w.q, s, TOPK, s.num_tokens)
        out, idx_md = _attend(w, stage(w.inputs, s), "build", topk)
        assert _problems(w, s, out, topk) == []
        num_reqs, num_tokens = bucket_for(cfg, s.num_tokens, np.random.default_rng(s.num_tokens))
        out, idx_md = _attend(w, stage_mixed(w.inputs, s, num_reqs, num_tokens), "build_mixed",
                              topk)
        assert _problems(w, s, out, topk) == []
        assert (out[s.num_tokens:].cpu() == UNTOUCHED).all()
        td = _decode_tokens(cfg, s)
        pre = topk[td : s.num_tokens]
        shapes["padded"] += int(((pre < 0).any(1) & (pre >= 0).any(1)).sum())
        pos = np.concatenate([np.arange(n - q, n) for q, n in zip(s.query_lens, s.seq_lens)])
        shapes["short"] += int((pos[td:] + 1 < TOPK).sum())

    check()
    assert shapes["padded"] > 0 and shapes["short"] > 0, shapes


#: Steps whose keys overflow the workspace (1100 keys): (query lengths, sequence lengths,
#: the bucket's requests). Two long prefills after a decode, each a chunk of its own;
#: six short prefills, then a long one in a chunk of its own.
OVERFLOWS = {"two-long": ([1, 70, 50], [700, 1000, 900], 4),
             "short-then-long": ([5] * 6 + [40], [100] * 6 + [1000], 8)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("build", ["build", "build_mixed"])
@pytest.mark.parametrize("case", list(OVERFLOWS))
def test_keys_past_one_chunk_attend_chunk_by_chunk(build, case, device):
    query_lens, seq_lens, bucket_reqs = OVERFLOWS[case]
    cfg = _config(device)
    w = _world(cfg)
    s = make_step(cfg, query_lens, seq_lens, rng=np.random.default_rng(1), num_blocks=BLOCKS)
    topk = new_inputs(w.q, s, TOPK, 5)
    batch = (stage(w.inputs, s) if build == "build"
             else stage_mixed(w.inputs, s, bucket_reqs, 128))
    out, idx_md = _attend(w, batch, build, topk)
    if build == "build":
        assert len(idx_md.prefill.chunks) >= 2
    assert _problems(w, s, out, topk) == []


def _make(cfg: ArenaConfig, *, heads: int = HEADS, topk: int = TOPK, dim: int = 576,
          cache: torch.Tensor | None = None) -> SparseMLAPrefill:
    q = torch.zeros(cfg.max_num_batched_tokens, heads, dim, dtype=torch.bfloat16)
    return SparseMLAPrefill(cfg, kv_cache=alloc_ds_mla_cache(2, "cpu") if cache is None
                            else cache, q=q, topk=topk, sparse_fwd_fn=emulated_sparse_fwd)


@pytest.mark.parametrize("make,match", [
    (lambda: _make(_config(dcp_world_size=2, dcp_rank=0)), "without decode context"),
    (lambda: _make(ArenaConfig.deepseek_v4(max_model_len=1024, max_num_seqs=8,
                                           max_num_batched_tokens=128, device="cpu")),
     "V3.2's layout"),
    (lambda: _make(_config(block_size=128)), "V3.2's layout"),
    (lambda: _make(_config(), heads=32), "multiple of 64"),
    (lambda: _make(_config(), dim=512), "d_qk = 576"),
    (lambda: _make(_config(), topk=64), "multiple of 128"),
    (lambda: _make(_config(), cache=torch.zeros(2, 64, 1, 584, dtype=torch.uint8)),
     "fp8_ds_mla"),
], ids=["dcp", "v4", "block-128", "heads", "head-dim", "topk", "cache"])
def test_what_the_sm90_kernel_does_not_serve_is_refused(make, match):
    with pytest.raises(ConfigError, match=match):
        make()


def test_the_ds_mla_cache_holds_the_keys_in_656_bytes_a_token():
    """Written from float keys, read back by the layout (not the package's reader): NoPE
    within e4m3's precision, each 128-tile's scale a power of two that fits its amax in
    e4m3, RoPE exactly the bf16 keys."""
    g = torch.Generator().manual_seed(3)
    kv = torch.randn(2, 64, 576, generator=g) * 5
    kv[0, 0, 128:256] = 0  # a tile of zeros: the floored amax keeps its scale finite
    cache = alloc_ds_mla_cache(2, "cpu")
    write_ds_mla_cache(cache, kv)
    back = dequant_ds_mla_cache(cache).view(2, 64, 576).float()
    scales = cache.view(-1, 656)[:, 512:528].contiguous().view(torch.float32)
    assert torch.equal(torch.exp2(torch.log2(scales).round()), scales)
    amax = kv[..., :512].reshape(-1, 4, 128).abs().amax(-1)
    assert ((amax / scales <= 448) & ((amax == 0) | (amax / scales > 224))).all()
    err = (back[..., :512] - kv[..., :512]).abs()
    assert (err <= scales.view(2, 64, 4, 1).repeat_interleave(128, -1).view(2, 64, 512)
            * 16).all()
    assert torch.equal(back[..., 512:], kv[..., 512:].to(torch.bfloat16).float())
