"""Per-rank SWA windows and dense shares under decode context parallelism, the option beside
replication (``vllm-0.33-extras.md`` §7.2): the spec's worked examples through the kernels,
and randomized steps through the real SWA builder, each rank's share against the oracle
(``staticattn/reference/dcp_shares.py``) and the ranks' shares a partition of the
single-GPU row -- on both kernel backends."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.support import DEVICE, host_steps, make_step, quiet, stage
from hypothesis import example, given, settings

from staticattn.arena import ArenaConfig
from staticattn.builders import make_arena
from staticattn.builders.swa.builder import SparseSWAMetadataBuilder
from staticattn.consumers.dcp.shares import DCPRankShares
from staticattn.kernels.dcp.rank_shares import dense_rank_share, swa_rank_share
from staticattn.reference import dcp_shares as oracle
from staticattn.reference import v41_compressed

I32 = dict(dtype=torch.int32, device=DEVICE)


def _swa(backend, rows, lens, positions, world, rank):
    out = torch.full((len(rows), len(rows[0])), 9, **I32)
    got_lens = torch.full((len(rows),), 9, **I32)
    swa_rank_share(backend, torch.tensor(rows, **I32), torch.tensor(lens, **I32),
                   torch.tensor(positions, device=DEVICE), out, got_lens,
                   num_rows=len(rows), world=world, rank=rank)
    return [r[:n] for r, n in zip(out.tolist(), got_lens.tolist())], out.tolist()


@pytest.mark.parametrize(("world", "want"), [
    (2, [[[86, 88, 90], [120, 122]], [[85, 87, 89], [121, 123]]]),
    (3, [[[86, 89], [120, 123]], [[87, 90], [121]], [[85, 88], [122]]]),
])
def test_the_swa_example_of_the_spec(backend, world, want):
    """W = 6, bs = 4, decodes at p = 10 and 3, table [[20, 21, 22], [30, 31, 32]]."""
    rows = [list(range(85, 91)), [120, 121, 122, 123, -1, -1]]
    table = [[20, 21, 22], [30, 31, 32]]
    for rank in range(world):
        got, whole = _swa(backend, rows, [6, 4], [10, 3], world, rank)
        assert got == want[rank]
        assert got == [oracle.swa_share(p, 6, table[b], 4, world, rank)
                       for b, p in enumerate((10, 3))]
        assert all(x == -1 for r, g in zip(whole, got) for x in r[len(g):])


def test_the_dense_example_of_the_spec(backend):
    """S = 2, positions [639, 255], table [[60, 61, 62], [70, 71, 72]]: dcp = 1 rows
    [120..124] and [140, 141]; world 2: rank 0 [120, 121, 122], [140]; rank 1 [120, 121],
    [140]."""
    table = [[60, 61, 62], [70, 71, 72]]
    want = {1: [[120, 121, 122, 123, 124], [140, 141]],
            2: [[[120, 121, 122], [140]], [[120, 121], [140]]]}
    for world in (1, 2):
        for rank in range(world):
            out = torch.full((2, 5), 9, **I32)
            lens = torch.full((2,), 9, **I32)
            dense_rank_share(backend, torch.tensor([5, 2], **I32), torch.tensor([0, 1], **I32),
                             torch.tensor(table, **I32), out, lens, num_rows=2,
                             entries_per_block=2, world=world, rank=rank)
            got = [r[:n] for r, n in zip(out.tolist(), lens.tolist())]
            assert got == (want[1] if world == 1 else want[2][rank])
            assert got == [oracle.dense_share(p, 5, table[b], 2, world, rank)
                           for b, p in enumerate((639, 255))]


def _v4(backend, **kw):
    base = dict(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=4096, num_sms=8,
                device=DEVICE, kernel_backend=backend)
    base.update(kw)
    return ArenaConfig.deepseek_v4(**base)


@pytest.mark.parametrize("world", [2, 3])
def test_shares_of_built_rows_partition_them(backend, world):
    cfg = _v4(backend)
    builder = SparseSWAMetadataBuilder()
    _, inputs = make_arena(cfg, [builder])
    ranks = [DCPRankShares(cfg.replace(dcp_world_size=world, dcp_rank=r,
                                       cp_kv_cache_interleave_size=4))
             for r in range(world)]
    s_c = cfg.dense_layer_type.entries_per_block(cfg.block_size)
    writes = 0

    @settings(max_examples=15 if backend == "torch" else 4, deadline=None)
    @given(host_steps(cfg, max_seq_len=4096))
    # Decodes whose last tokens complete a dense entry (positions 127 and 383): every run
    # checks the writer side, whatever the drawn steps hold.
    @example(make_step(cfg, np.full(2, cfg.next_n), np.array([128, 384])))
    def check(step):
        batch = stage(inputs, step)
        md = {"swa": builder.build(batch)}
        swa = md["swa"]
        td = swa.num_decode_tokens
        owner, position, own = v41_compressed.tokens(step)
        whole = swa.decode_swa_indices.reshape(td, cfg.sliding_window).tolist()
        whole_lens = swa.decode_swa_lens.tolist()
        nonlocal writes
        every_swa, every_c = [[] for _ in range(td)], [0] * td
        for rank, shares in enumerate(ranks):
            out = shares(batch, md)
            rows, lens, c_rows, c_lens, c_slots = (out[k].tolist() for k in (
                "swa", "swa_lens", "dense", "dense_lens", "dense_slots"))
            # The writer side: every real token, padded ones -1.
            assert c_slots == [oracle.dense_write_slot(p, step.block_table[b], s_c, world,
                                                       rank) for b, p in zip(owner, position)
                               ] + [-1] * (len(c_slots) - len(owner))
            writes += sum(x >= 0 for x in c_slots)
            for t in range(td):
                # A padded decode row (a uniform step padded to its graph) shares nothing.
                real = t < len(owner)
                b, p = (owner[t], position[t]) if real else (0, 0)
                valid = real and own[t] >= 0
                want = oracle.swa_share(p, cfg.sliding_window, step.swa_block_table[b],
                                        cfg.swa_block_size, world, rank) if valid else []
                assert rows[t][: lens[t]] == want and set(rows[t][lens[t]:]) <= {-1}
                every_swa[t] += want
                want = oracle.dense_share(p, cfg.dense_width, step.block_table[b], s_c,
                                          world, rank) if valid else []
                assert c_rows[t][: c_lens[t]] == want and set(c_rows[t][c_lens[t]:]) <= {-1}
                every_c[t] += c_lens[t]
        for t in range(td):
            assert sorted(every_swa[t]) == sorted(whole[t][: whole_lens[t]])
        assert every_c == swa.dense_decode_lens.tolist()

    check()
    assert writes > 0


@pytest.mark.parametrize("world", [2, 3])
def test_the_dense_writer_slots(backend, world):
    """A prefill over positions 100..299 and a decode at 511 complete dense entries 0, 1 and
    3; each is written on its owner only (``e % world``), at the local slot of ``e //
    world``."""
    cfg = _v4(backend, max_num_batched_tokens=256)
    builder = SparseSWAMetadataBuilder()
    _, inputs = make_arena(cfg, [builder])
    step = make_step(cfg, [1, 200], [512, 300])
    batch = stage(inputs, step)
    md = {"swa": builder.build(batch)}
    s_c = cfg.dense_layer_type.entries_per_block(cfg.block_size)
    owner, position, _ = v41_compressed.tokens(step)
    written = []
    for rank in range(world):
        shares = DCPRankShares(cfg.replace(dcp_world_size=world, dcp_rank=rank,
                                           cp_kv_cache_interleave_size=4))
        slots = shares(batch, md)["dense_slots"].tolist()
        assert slots == [oracle.dense_write_slot(p, step.block_table[b], s_c, world, rank)
                         for b, p in zip(owner, position)]
        written += [(position[t], rank) for t, x in enumerate(slots) if x >= 0]
    assert sorted(written) == sorted((p, (p // 128) % world) for p in (511, 127, 255))



@pytest.mark.gpu
def test_shares_replay_in_decode_graphs():
    """Captured with the SWA builder's decode build (at minimal lengths), replayed over
    random decode steps: every replay equals the eager reference build's shares."""
    from staticattn.bench.random_batches import random_uniform_decode
    from staticattn.graphs import EagerBuild, GraphManager

    cfg = _v4("triton")
    builder = SparseSWAMetadataBuilder()
    arena, inputs = make_arena(cfg, [builder])
    shares = DCPRankShares(cfg.replace(dcp_world_size=2, dcp_rank=1,
                                       cp_kv_cache_interleave_size=4))
    rng = np.random.default_rng(0)
    with GraphManager(arena, inputs, [builder], shares, quiet()) as gm:
        gm.capture([2, 8, 16], buckets=())
        for _ in range(50):
            k = int(rng.integers(1, 9))
            s = random_uniform_decode(inputs, k, rng, num_kv_blocks=64)
            args = (s.query_lens, s.seq_lens, s.slot_mapping)
            res = gm.run(*args)
            assert res.mode == "graph"
            got = {k: x.clone() for k, x in res.outputs.items()}
            want = gm.run(*args, eager=EagerBuild.REFERENCE).outputs
            for key, g in got.items():
                n = len(s.slot_mapping)
                assert torch.equal(g[:n], want[key][:n]), key
