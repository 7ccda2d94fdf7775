"""DeepSeek V4.1 under decode context parallelism across processes on the CPU: two ranks
joined by gloo, each running the DCP demo's V4.1 world (``distributed.world``) for the same
random decode steps, and the single-process step beside it.

Every step of every rank equals the single-process step (each index type's top-k exactly,
its merged output within float32 rounding) and every other rank's, and, for each step's
first token of each index type, the oracle over the global keys
(``staticattn/reference/topk_attention.py``); each rank's compressed slot mappings equal the
per-rank oracle (``staticattn/reference/v41_dcp.py``), and across the ranks every entry the
single-process step writes is written by exactly one rank.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch.distributed as dist
from helpers import dcp_workers as workers

from staticattn.arena import cache_groups, cdiv
from staticattn.model import Cache
from staticattn.reference import topk_attention
from staticattn.reference import v41_dcp as oracle
from staticattn.reference.step import HostStep
from staticattn.reference.v41_compressed import V41Step

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="needs torch.distributed with gloo")


def _v41_step(cfg, seq_lens: list[int]) -> V41Step:
    """The demo's step as the oracle takes it: uniform decodes, the slots their positions,
    the block rows (``1 + arange``) in every sharded group, cut to the rank's columns, in
    reverse request order in the compressed-KV groups (``world.write_decode_step``)."""
    n, k = cfg.next_n, len(seq_lens)
    columns = cdiv(cfg.max_model_len, cfg.block_size)
    table = 1 + np.arange(k * columns, dtype=np.int32).reshape(k, -1)
    positions = np.concatenate([np.arange(L - n, L) for L in seq_lens])
    step = HostStep(np.full(k, n, np.int32), np.asarray(seq_lens, np.int32), positions, table,
                    None, k, k * n)
    tables = {g.name: (table[::-1] if g.cache is Cache.COMPRESSED_KV else table)[:, : g.columns]
              for g in cache_groups(cfg) if g.cache is not Cache.COMPRESSOR_STATE}
    return V41Step(step, tables)


def _first_tokens_match_the_oracle(cfg, data, outputs) -> None:
    """Each index type's ids and output of the step's first token (position ``L - n``) equal
    the oracle over its ``L // R`` global keys."""
    from staticattn.distributed.world import TOPK

    n, L = cfg.next_n, int(data["seq_lens"][0])
    for i, t in enumerate(cfg.index_layer_types):
        entries = L // t.compress_ratio
        ids, out = topk_attention.decode_token(
            data["q"][0].numpy(), data["weights"][0].numpy(), data["q_att"][0].numpy(),
            data["keys"][0][:entries].numpy(), data["kv"][0][:entries].numpy(),
            (L - n + 1) // t.compress_ratio, TOPK)
        assert outputs[2 * i][0] == ids + [-1] * (TOPK - len(ids)), t.name
        np.testing.assert_allclose(outputs[2 * i + 1][0], out, rtol=1e-4, atol=1e-5)


def test_two_v41_ranks_equal_the_single_process_step_and_the_oracle(tmp_path):
    from staticattn.distributed.world import dcp_config, random_decode_step

    records = workers.spawn_ranks(workers.v41_consumer_steps, tmp_path)
    assert len(records[0]["steps"]) == workers.V41_STEPS
    rng = np.random.default_rng(workers.V41_SEED)  # the workers' steps
    cfg0 = dcp_config(workers.V41_PRESET, workers.WORLD, 0, "cpu")
    for steps in zip(*(r["steps"] for r in records)):
        data = random_decode_step(cfg0, rng, num_reqs=int(rng.integers(1, 9)))
        assert data["seq_lens"].tolist() == steps[0]["seq_lens"]
        _first_tokens_match_the_oracle(cfg0, data, steps[0]["runs"][0]["outputs"])
        seq_lens = steps[0]["seq_lens"]
        written = {}
        for rank, s in enumerate(steps):
            dcp, single = s["runs"]
            outputs = zip(dcp["outputs"], single["outputs"], steps[0]["runs"][0]["outputs"])
            for i, (got, want, rank0) in enumerate(outputs):
                assert got == rank0  # every rank holds the merged result
                if i % 2 == 0:
                    assert got == want  # each index type's top-k ids, exactly
                else:
                    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
            cfg = dcp_config(workers.V41_PRESET, workers.WORLD, rank, "cpu")
            v41 = _v41_step(cfg, seq_lens)
            want = oracle.compressed(cfg, v41, rank, len(seq_lens), v41.step.num_tokens)
            for t, slots in dcp["slots"].items():
                assert slots == want[t]["slot_mapping"], (rank, t)
                written[t] = np.add(written.get(t, 0), np.asarray(slots) >= 0)
        for t, count in written.items():
            whole = np.asarray(steps[0]["runs"][1]["slots"][t]) >= 0
            assert count.tolist() == whole.astype(int).tolist(), t
