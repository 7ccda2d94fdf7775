"""DeepSeek V4.1 under decode context parallelism across processes on the CPU: two ranks
joined by gloo, each running the DCP demo's V4.1 world (``distributed.world``) for the same
random decode steps, and the single-process step beside it.

Every step of every rank equals the single-process step (each index type's top-k exactly,
its merged output within float32 rounding) and every other rank's; each rank's compressed
slot mappings equal the per-rank oracle (``staticattn/reference/v41_dcp.py``), and across the
ranks every entry the single-process step writes is written by exactly one rank.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch.distributed as dist
from helpers import dcp_workers as workers

from staticattn.arena import cache_groups, cdiv
from staticattn.model import Cache
from staticattn.reference import v41_dcp as oracle
from staticattn.reference.step import HostStep
from staticattn.reference.v41_compressed import V41Step

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="needs torch.distributed with gloo")


def _v41_step(cfg, seq_lens: list[int]) -> V41Step:
    """The demo's step as the oracle takes it: uniform decodes, the slots their positions,
    the same block rows (``1 + arange``) in every sharded group, cut to the rank's columns."""
    n, k = cfg.next_n, len(seq_lens)
    columns = cdiv(cfg.max_model_len, cfg.block_size)
    table = 1 + np.arange(k * columns, dtype=np.int32).reshape(k, -1)
    positions = np.concatenate([np.arange(L - n, L) for L in seq_lens])
    step = HostStep(np.full(k, n, np.int32), np.asarray(seq_lens, np.int32), positions, table,
                    None, k, k * n)
    tables = {g.name: table[:, : g.columns] for g in cache_groups(cfg)
              if g.cache is not Cache.COMPRESSOR_STATE}
    return V41Step(step, tables)


def test_two_v41_ranks_equal_the_single_process_step_and_the_oracle(tmp_path):
    from staticattn.distributed.world import dcp_config

    records = workers.spawn_ranks(workers.v41_consumer_steps, tmp_path)
    assert len(records[0]["steps"]) == workers.V41_STEPS
    for steps in zip(*(r["steps"] for r in records)):
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
