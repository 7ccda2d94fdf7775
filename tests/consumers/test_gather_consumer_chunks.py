"""The gather consumer reads the C128A prefill rows chunk by chunk (each chunk written into the
workspace, then summed, inside the step): its checksums equal the step-alone oracle's -- the
same sums a buffer of one row per prefill token gave -- with a workspace of one row, of a
few rows and of a whole step, through ``GraphManager.run`` (a token bucket's graph, a decode
graph, the eager fallback, the reference's eager build) and the in-place ``launch``; the
arena's fingerprint stays what it was."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.emulated_graphs import graphs_for
from helpers.gather_world import gather_world
from helpers.support import DEVICE, fuzz_examples, host_steps, quiet
from helpers.v41_swa_steps import write_step_tables
from hypothesis import HealthCheck, given, settings

from staticattn.arena import ArenaConfig
from staticattn.builders.swa.declarations import dense_prefill_chunk_rows
from staticattn.graphs import EagerBuild, GraphManager
from staticattn.reference import checksums

#: maxC = 128 (max_model_len 4096): 512 bytes a row; 64 tokens a step.
SMALL = dict(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=4096,
             num_speculative_tokens=1, max_prefill_workspace=3000,
             max_logits_bytes=200_000, device=DEVICE)


@pytest.mark.parametrize("rows", [1, 3, 64])
def test_chunked_dense_rows_give_the_oracle_checksums_on_every_path(backend, rows):
    cfg = ArenaConfig.deepseek_v4(**SMALL, kernel_backend=backend,
                                  dense_prefill_workspace_bytes=rows * 4 * 128)
    assert dense_prefill_chunk_rows(cfg) == rows
    arena, inputs, builders, consumer, caches = gather_world(cfg)
    gm = GraphManager(arena, inputs, builders, consumer, quiet())
    graphs_for(gm)  # decode graphs of 2, 4, 8 requests; token buckets of 16 and 32 tokens
    fingerprint = arena.fingerprint()

    @settings(max_examples=fuzz_examples(backend, 30, 3), deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(host_steps(cfg, max_reqs=8, max_seq_len=4096))
    def check(step):
        write_step_tables(inputs, step)
        want = checksums.expected(cfg, step, *caches, step.num_tokens)
        args = (step.query_lens, step.seq_lens, step.slot_mapping)
        assert gm.run(*args).outputs.tolist() == want
        assert gm.run(*args, eager=EagerBuild.REFERENCE).outputs.tolist() == want
        views = gm.begin_step()
        k, t = step.num_reqs, step.num_tokens
        views.seq_lens[:k], views.slot_mapping[:t] = step.seq_lens, step.slot_mapping
        views.query_start_loc[: k + 1] = np.concatenate(([0], np.cumsum(step.query_lens)))
        assert gm.launch(k, t)[:t].tolist() == want  # a graph hands its bucket's rows

    check()
    assert arena.fingerprint() == fingerprint
    assert gm.stats.replays_total > 0
