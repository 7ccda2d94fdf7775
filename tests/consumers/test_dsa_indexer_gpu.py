"""The indexer's real consumer captured in the graph: staging + IndexerMetadataBuilder +
DeepGEMM ``fp8_paged_mqa_logits`` + masked top-k, replayed on randomized batches (padded ones
included, captured at minimal lengths and replayed at long ones), each replay's top-k
checked against a torch reference built from the host truth."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from helpers.support import quiet

from staticattn.kernels.runtime.dsa_libs import DEEP_GEMM, import_error

pytestmark = pytest.mark.gpu

if import_error(DEEP_GEMM):
    pytest.skip(import_error(DEEP_GEMM), allow_module_level=True)

from helpers.dsa_reference import (  # noqa: E402
    fill_indexer_cache,
    indexer_problems,
    new_indexer_inputs,
    replay_sizes,
)

from staticattn.arena import ArenaConfig  # noqa: E402
from staticattn.builders import make_arena  # noqa: E402
from staticattn.builders.indexer.builder import IndexerMetadataBuilder  # noqa: E402
from staticattn.consumers.real.indexer_topk import IndexerTopKStep  # noqa: E402
from staticattn.graphs import GraphManager  # noqa: E402

REPLAYS = 200
BLOCKS = 2048

CONFIGS = {
    # V3.2: 64-token blocks, R = 1, plain decode, top-2048
    "v32": (dict(preset="deepseek-v3.2", max_model_len=32768, max_num_seqs=64,
                 max_num_batched_tokens=64), (2, 16, 64)),
    # V4: 256-token blocks, R = 4 (64 compressed entries per block), native MTP next_n = 2
    "v4-mtp2": (dict(preset="deepseek-v4", max_model_len=65536, max_num_seqs=32,
                     max_num_batched_tokens=64), (2, 16, 64)),
    # V3.2 with next_n = 3: flattened to single-token rows with an expanded block table
    "v32-mtp3-flat": (dict(preset="deepseek-v3.2", max_model_len=16384,
                           num_speculative_tokens=2, max_num_seqs=21,
                           max_num_batched_tokens=63), (3, 15, 63)),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_indexer_topk_replays(name):
    kw, sizes = CONFIGS[name]
    kw = dict(kw)
    cfg = ArenaConfig.preset(kw.pop("preset"), device="cuda", **kw)
    builders = [IndexerMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    step = IndexerTopKStep(cfg, num_kv_blocks=BLOCKS)
    keys = fill_indexer_cache(step)
    rng = np.random.default_rng(list(CONFIGS).index(name))
    t0 = time.perf_counter()
    with GraphManager(arena, inputs, builders, step, quiet()) as gm:
        # Decode graphs only: the real kernels serve decode tokens. The warm-up per size is
        # one eager pass: DeepGEMM JIT-compiles there.
        gm.capture(sizes, buckets=())
        t1 = time.perf_counter()
        failures, counts = replay_sizes(
            gm, sizes, REPLAYS, rng, BLOCKS,
            before=lambda i: new_indexer_inputs(step, 1000 + i),
            check=lambda s, out: indexer_problems(step, inputs, s, out, keys),
        )
        print(f"{name}: capture {t1 - t0:.1f}s, {sum(counts.values())} replays "
              f"{time.perf_counter() - t1:.1f}s; top-k {step.topk} of up to "
              f"{step.max_context_len} keys; replays per size {counts}")
    assert not failures, "\n".join(failures)
    assert all(c >= REPLAYS for c in counts.values()), counts


def test_indexer_prefill_topk_replays_in_mixed_graphs():
    """Decode and prefill tokens alike through DeepGEMM (paged logits for the decodes,
    ``fp8_mqa_logits`` over each prefill chunk's gathered keys), the prefill chunks planned
    on the device inside token-bucket graphs (steps whose keys overflow one chunk included):
    every real token's top-k against the reference, and the same rows as the eager build's."""
    from helpers.support import host_steps
    from hypothesis import HealthCheck, given, settings

    from staticattn.distributed.pcp_world import step_slots
    from staticattn.graphs import GraphKind

    cfg = ArenaConfig.preset("deepseek-v3.2", device="cuda", max_model_len=8192,
                             max_num_seqs=16, max_num_batched_tokens=256,
                             max_prefill_workspace=12_000, max_logits_bytes=4 << 20,
                             index_topk=512)
    builders = [IndexerMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    step = IndexerTopKStep(cfg, num_kv_blocks=BLOCKS, prefill=True)
    keys = fill_indexer_cache(step)
    counts = {GraphKind.MIXED: 0, GraphKind.DECODE: 0}
    with GraphManager(arena, inputs, builders, step, quiet()) as gm:
        gm.capture([16], buckets=[64, 256])

        @settings(max_examples=40, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.filter_too_much])
        @given(host_steps(cfg, kinds=("mixed",), max_seq_len=cfg.max_model_len))
        def check(s):
            new_indexer_inputs(step, s.num_tokens)
            table = s.block_table % (BLOCKS - 1) + 1
            inputs.block_table[: s.num_reqs].copy_(torch.as_tensor(table))
            slots = step_slots(dict(query_lens=s.query_lens, table=torch.as_tensor(table),
                                    num_computed=s.seq_lens - s.query_lens), cfg.block_size)
            res = gm.run(s.query_lens, s.seq_lens, slots)
            assert res.mode == "graph", res.reason
            counts[res.graph_kind] += 1
            got = res.outputs.clone()
            assert indexer_problems(step, inputs, s, got, keys) == []
            eager = gm.run_eager(s.query_lens, s.seq_lens, slots)
            assert indexer_problems(step, inputs, s, eager, keys) == []

        check()
    assert counts[GraphKind.MIXED] >= 10 and counts[GraphKind.DECODE], counts

