"""Graph manager on the GPU with a toy builder: capture, pad, replay, fall back."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.support import quiet
from helpers.toy import ToyBuilder, ToyStep, toy_expected

from staticattn.arena import ArenaConfig
from staticattn.builders import make_arena
from staticattn.graphs import EagerReason, GraphKind, GraphManager

pytestmark = pytest.mark.gpu


def _setup(**kw):
    base = dict(max_num_seqs=64, max_num_batched_tokens=512, max_model_len=16384)
    base.update(kw)
    cfg = ArenaConfig.deepseek_v4(**base)
    b = ToyBuilder()
    arena, inputs = make_arena(cfg, [b])
    return cfg, arena, inputs, GraphManager(arena, inputs, [b], ToyStep(cfg, arena.device),
                                            quiet())


def test_capture_replay_pad_and_fallback():
    cfg, arena, inputs, gm = _setup()
    with gm:
        gm.capture([2, 8, 32, 64], buckets=())
        assert gm.capture_sizes == [2, 8, 32, 64]
        for g in gm.graphs.values():
            assert g.nodes is None or g.nodes.get("kernel", 0) >= 1
        before = arena.fingerprint()
        rng = np.random.default_rng(0)
        torch.cuda.synchronize()
        allocs0 = torch.cuda.memory_stats()["allocation.all.allocated"]
        for _ in range(300):
            k = int(rng.integers(1, 64))
            q = np.full(k, cfg.next_n)
            s = rng.integers(cfg.next_n, cfg.max_model_len, size=k)
            res = gm.run(q, s, np.arange(k * cfg.next_n))
            assert res.outputs.tolist() == toy_expected(q, s)
            assert res.mode == ("graph" if k * 2 <= 64 else "eager")
        torch.cuda.synchronize()
        res = gm.run([2, 1], [9, 4], [0, 1, 2])
        assert res.mode == "eager" and res.reason is EagerReason.NON_UNIFORM
        assert res.outputs.tolist() == toy_expected([2, 1], [9, 4])
        res = gm.run([2, 7], [9, 40], np.arange(9))
        assert res.reason is EagerReason.PREFILL
        assert arena.fingerprint() == before
        assert gm.stats.replays[GraphKind.DECODE] > 0
        assert gm.stats.eager[EagerReason.TOO_LARGE] > 0
        replay_allocs = torch.cuda.memory_stats()["allocation.all.allocated"] - allocs0
        print("allocations over 300 mixed steps (eager ones included):", replay_allocs)


def test_replay_allocates_nothing():
    cfg, arena, inputs, gm = _setup()
    with gm:
        gm.capture([16], buckets=())
        gm.run([2] * 8, [100] * 8, np.arange(16))
        torch.cuda.synchronize()
        stats0 = torch.cuda.memory_stats()["allocation.all.allocated"]
        for i in range(200):
            gm.run([2] * 5, [100 + i] * 5, np.arange(10))
        torch.cuda.synchronize()
        assert torch.cuda.memory_stats()["allocation.all.allocated"] == stats0


def test_every_step_replays_with_token_buckets():
    """With token buckets captured, decodes of unequal lengths, prefills and decode batches
    beyond the decode graphs replay too; only a step beyond every bucket runs eagerly."""
    cfg, arena, inputs, gm = _setup()
    with gm:
        gm.capture([2, 8], buckets=[16, 64, 512])
        rng = np.random.default_rng(1)
        modes = []
        for _ in range(200):
            k = int(rng.integers(1, 40))
            q = rng.integers(1, 9, size=k)
            q.sort()
            s = q + rng.integers(0, 1000, size=k)
            res = gm.run(q, s, np.arange(int(q.sum())))
            assert res.outputs.tolist() == toy_expected(q, s)
            modes.append((res.mode, res.graph_kind))
        assert set(modes) <= {("graph", GraphKind.DECODE), ("graph", GraphKind.MIXED)}
        assert gm.stats.eager_total == 0 and gm.stats.replays[GraphKind.MIXED] > 0


def test_in_place_launch_equals_run():
    cfg, arena, inputs, gm = _setup()
    n = cfg.next_n
    with gm:
        gm.capture([2, 8, 32], buckets=[64, 512])
        rng = np.random.default_rng(2)
        for _ in range(100):
            k = int(rng.integers(1, 16))
            s = rng.integers(n, cfg.max_model_len - 40, size=k).astype(np.int32)
            views = gm.begin_step()
            views.seq_lens[:k] = s
            views.slot_mapping[: k * n] = np.arange(k * n)
            out = gm.launch(k)
            assert out[: k * n].tolist() == toy_expected(np.full(k, n), s)
            q = rng.integers(1, 40, size=k)
            q[::2] = n
            views = gm.begin_step()
            views.query_start_loc[0] = 0
            np.cumsum(q, out=views.query_start_loc[1 : k + 1])
            views.seq_lens[:k] = q + s
            views.slot_mapping[: int(q.sum())] = np.arange(int(q.sum()))
            out = gm.launch(k, int(q.sum()))
            assert out[: int(q.sum())].tolist() == toy_expected(q, q + s)


class _NoisyStep(ToyStep):
    """The toy step plus noise drawn from the default CUDA generator, into a fixed buffer."""

    def __init__(self, cfg, device) -> None:
        super().__init__(cfg, device)
        self.noise = torch.zeros(cfg.max_num_batched_tokens, device=device)

    def __call__(self, batch, md):
        self.noise[: batch.num_actual_tokens].uniform_()
        return super().__call__(batch, md)


def test_a_step_drawing_random_numbers_replays_through_replay():
    """A graph whose work draws random numbers launches through ``replay()`` (which
    advances the generator: fresh numbers every replay); the others launch raw when
    cuda-bindings is there."""
    from staticattn.graphs.introspect import cudart_or_none

    raw = "cudaGraphLaunch" if cudart_or_none() is not None else "replay"
    cfg, arena, inputs, gm = _setup()
    with gm:
        gm.capture([4], buckets=())
        assert gm.graphs[4].how == raw
    b = ToyBuilder()
    arena, inputs = make_arena(cfg, [b])
    step = _NoisyStep(cfg, arena.device)
    with GraphManager(arena, inputs, [b], step, quiet()) as gm:
        gm.capture([4], buckets=())
        assert gm.graphs[4].how == "replay"
        draws = []
        for _ in range(3):
            res = gm.run([2, 2], [9, 40], np.arange(4))
            assert res.mode == "graph" and res.outputs.tolist() == toy_expected([2, 2], [9, 40])
            draws.append(step.noise[:4].clone())
        assert not torch.equal(draws[0], draws[1]) and not torch.equal(draws[1], draws[2])


def test_pool_memory_is_what_the_captures_allocate():
    """A step that allocates its output inside the capture puts it in the graph pool; the
    graphs' ``pool_bytes`` add up to the pool's segments, and builds that write only into
    the arena add nothing."""
    cfg, arena, inputs, gm = _setup()
    with gm:
        gm.capture([2], buckets=())  # the toy step writes its own buffer: no pool memory
        assert gm.graphs[2].pool_bytes == gm.pool.held_bytes() == 0
    b = ToyBuilder()
    arena, inputs = make_arena(cfg, [b])
    toy = ToyStep(cfg, arena.device)

    def allocating(batch, md):
        return toy(batch, md) + torch.zeros(4 << 20, dtype=torch.uint8, device="cuda").sum()

    with GraphManager(arena, inputs, [b], allocating, quiet()) as gm:
        gm.capture([2, 8], buckets=())
        total = gm.pool.held_bytes()
        assert total >= 4 << 20
        assert sum(g.pool_bytes for g in gm.graphs.values()) == total
        assert f"pool {total / 2**20:.2f} MiB" in gm.describe()
