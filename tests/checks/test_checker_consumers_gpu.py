"""The sanity checker passes, with notes only, on the built-in gather consumer and on the real
DeepGEMM + FlashMLA decode step (skipped when either library does not import)."""

from __future__ import annotations

import pytest

from staticattn.arena import ArenaConfig
from staticattn.builders import make_arena
from staticattn.builders.indexer.builder import IndexerMetadataBuilder
from staticattn.builders.swa.builder import SparseSWAMetadataBuilder
from staticattn.checks import check_graph_safety
from staticattn.consumers import GatherConsumer
from staticattn.kernels.runtime.dsa_libs import DEEP_GEMM, FLASH_MLA, import_error

pytestmark = pytest.mark.gpu


def _builders(cfg):
    return [IndexerMetadataBuilder()] + ([SparseSWAMetadataBuilder()] if cfg.has_swa else [])


def _assert_notes_only(report) -> None:
    print(report)
    assert report.ok, str(report)
    assert not report.errors and all(f.severity == "note" for f in report.findings)
    assert all(s.replays > 0 and s.mismatches == 0 for s in report.sizes), str(report)
    assert str(report).splitlines()[-1].startswith("PASS")


@pytest.mark.parametrize("preset, next_n", [("deepseek-v4", 1), ("deepseek-v4", 2),
                                            ("deepseek-v3.2", 1)])
def test_gather_consumer_passes(preset, next_n):
    cfg = ArenaConfig.preset(preset, max_model_len=16384, max_num_seqs=32,
                             max_num_batched_tokens=128,
                             num_speculative_tokens=next_n - 1, device="cuda")
    builders = _builders(cfg)
    arena, inputs = make_arena(cfg, builders)
    report = check_graph_safety(arena, inputs, builders, GatherConsumer(cfg),
                                sizes=[2 * next_n, 16 * next_n, 32 * next_n], num_batches=50)
    _assert_notes_only(report)


def test_real_deepgemm_flashmla_step_passes():
    for lib in (DEEP_GEMM, FLASH_MLA):
        if import_error(lib):
            pytest.skip(import_error(lib))
    from helpers.decode_steps import fill_caches, new_inputs

    from staticattn.builders import default_builders
    from staticattn.consumers.real.sparse_decode import SparseDecodeStep

    blocks = 1024
    cfg = ArenaConfig.deepseek_v4(max_model_len=16384, max_num_seqs=32,
                                  max_num_batched_tokens=64, device="cuda")
    builders = default_builders(cfg)
    arena, inputs = make_arena(cfg, builders)
    step = SparseDecodeStep(cfg, num_kv_blocks=blocks)
    fill_caches(step, 3)

    def before(i: int) -> None:  # fresh queries each step, written in place
        new_inputs(step, 3000 + i)

    report = check_graph_safety(arena, inputs, builders, step, sizes=[2, 16, 32],
                                num_batches=30, num_kv_blocks=blocks, before_batch=before)
    _assert_notes_only(report)


def test_check_command_json_on_the_gather_consumer(capsys):
    import json

    from staticattn.__main__ import main

    status = main(["check", "--preset", "deepseek-v3.2", "--max-model-len", "8192",
                   "--batch-requests", "2", "8", "--batches", "5", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert status == 0 and data["verdict"] == "PASS" and data["errors"] == 0, data
    assert [s["size"] for s in data["sizes"]] == [2, 8]
    assert all(s["replays"] == 5 and s["mismatches"] == 0 for s in data["sizes"])
