"""The checks that need no graph (``staticattn.checks.reference_check``), the comparisons
of the shipped reference, and the pytest plugin's cost when nothing uses it."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers.paths import ROOT
from helpers.support import DEVICE, quiet

from staticattn.arena import ArenaConfig
from staticattn.builders import IndexerMetadataBuilder, SparseSWAMetadataBuilder, make_arena
from staticattn.checks import check_eagerly, reference_mismatch
from staticattn.errors import GraphError
from staticattn.graphs import GraphManager, GraphOptions
from staticattn.reference.assertions import ReferenceMismatch, holds, same


def test_same_names_the_field_and_the_first_differing_row():
    same("lens", torch.tensor([1, 2, 3]), [1, 2, 3])
    with pytest.raises(ReferenceMismatch, match=r"^lens\[1\]: got 2, expected 5$"):
        same("lens", torch.tensor([1, 2, 3]), [1, 5, 3])
    with pytest.raises(ReferenceMismatch, match=r"^lens: 2 rows, expected 3$"):
        same("lens", [1, 2], [1, 2, 3])
    with pytest.raises(ReferenceMismatch, match=r"^num_decodes: got 1, expected 2$"):
        same("num_decodes", 1, 2)
    with pytest.raises(ReferenceMismatch, match="expected no decode metadata"):
        holds(False, "no decode metadata")
    assert issubclass(ReferenceMismatch, AssertionError)  # a failure in any test runner


def test_the_comparisons_survive_python_dash_o():
    """``python -O`` strips bare asserts: the reference must not rely on them."""
    code = ("from staticattn.reference.assertions import same\n"
            "try:\n    same('x', [1], [2])\nexcept AssertionError as e:\n    print('caught', e)\n")
    done = subprocess.run([sys.executable, "-O", "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.strip() == "caught x[0]: got 1, expected 2", done.stderr


def _manager(step=None, options=None):
    cfg = ArenaConfig.deepseek_v4(max_num_seqs=8, max_num_batched_tokens=256,
                                  max_model_len=4096, device=DEVICE)
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    rows = np.arange(1, 1 + 8 * cfg.max_blocks_per_req, dtype=np.int32).reshape(8, -1) % 4000
    inputs.block_table[:8].copy_(torch.from_numpy(rows))
    inputs.swa_block_table[:8].copy_(torch.from_numpy(
        np.arange(8 * cfg.max_swa_blocks_per_req, dtype=np.int32).reshape(8, -1) % 4000 + 1))
    return GraphManager(arena, inputs, builders, step or (lambda batch, md: None),
                        options or quiet())


def test_reference_mismatch_passes_a_true_build_and_names_a_wrong_one(monkeypatch):
    q, s = np.array([2, 2, 40], dtype=np.int32), np.array([300, 9, 40], dtype=np.int32)
    slots = np.arange(44, dtype=np.int64)
    with _manager() as gm:
        assert reference_mismatch(gm, q, s, slots) is None
        build = IndexerMetadataBuilder.build

        def off_by_one(self, batch):
            meta = build(self, batch)
            meta.positions[1] += 1  # one position wrong, as a kernel bug would write it
            return meta

        monkeypatch.setattr(IndexerMetadataBuilder, "build", off_by_one)
        assert reference_mismatch(gm, q, s, slots) == (
            "indexer: positions[1]: got 300, expected 299")

        def two_wrong(self, batch):
            meta = off_by_one(self, batch)
            meta.prefill.chunks[0].cu_seqlen_ke[0] += 1
            return meta

        # Fields are compared in IndexerMetadata's order: its prefill before its positions.
        monkeypatch.setattr(IndexerMetadataBuilder, "build", two_wrong)
        assert reference_mismatch(gm, q, s, slots).startswith(
            "indexer: prefill chunk cu_seqlen_ke[0]: ")


def test_check_eagerly_counts_every_step_and_catches_differing_outputs():
    with _manager() as gm:
        found = check_eagerly(gm, num_steps=4, seed=1)
    assert (found.steps, found.output_mismatches, found.reference_mismatches) == (4, 0, 0)
    assert found.ok and found.compared == ("indexer", "swa")
    assert found.lines()[0] == "4 random steps run eagerly:"

    calls = []

    def counting_step(batch, metadata):  # a different output on every call
        calls.append(1)
        return torch.full((batch.num_actual_tokens,), len(calls), device=DEVICE)

    with _manager(counting_step) as gm:
        found = check_eagerly(gm, num_steps=3, seed=1)
    assert (found.steps, found.output_mismatches, found.reference_mismatches) == (3, 3, 0)
    assert not found.ok and "outputs differ" in found.first_mismatch
    assert found.to_dict()["output_mismatches"] == 3


@pytest.mark.parametrize("pool", [64, 1])
def test_check_eagerly_draws_within_the_managers_pool(pool):
    """Its random block ids and slots stay in the manager's pool (a small one too), which
    the manager validates every step against; a larger pool asked for is refused."""
    options = GraphOptions(progress=False, num_kv_blocks=pool)
    with _manager(options=options) as gm:
        # Every step is validated against the pool (a CPU arena: the block ids of the
        # columns it uses too) before it runs: one id past it would raise here.
        found = check_eagerly(gm, num_steps=2, seed=3)
        assert found.ok and found.steps == 2, found.lines()
        with pytest.raises(GraphError, match=rf"num_kv_blocks=4096 exceeds the manager's "
                                             rf"pool, GraphOptions\(num_kv_blocks={pool}\)"):
            check_eagerly(gm, num_steps=1, num_kv_blocks=4096)


def test_the_pytest_plugin_registers_without_torch():
    """Loading the plugin (what every pytest run in an environment holding staticattn does)
    imports neither torch nor numpy nor any heavy part of staticattn."""
    code = ("import sys\nimport staticattn.checks.pytest_plugin\n"
            "print(sorted(m for m in sys.modules if m.startswith('staticattn')))\n"
            "print('torch' in sys.modules, 'numpy' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    modules, heavy = done.stdout.strip().splitlines()
    assert modules == ("['staticattn', 'staticattn.checks', 'staticattn.checks.pytest_plugin', "
                       "'staticattn.lazy']")
    assert heavy == "False False", done.stderr


def test_a_pytest_run_that_does_not_use_the_fixture_loads_no_torch(tmp_path):
    (tmp_path / "test_light.py").write_text(
        "import sys\n\n\ndef test_light():\n    assert 'torch' not in sys.modules\n")
    # Only this plugin (the others of this environment are not ours to measure).
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "staticattn.checks.pytest_plugin", "--graph-safety-batches",
                           "3", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "1 passed" in out, out
