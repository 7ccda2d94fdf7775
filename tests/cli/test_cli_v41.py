"""The command line on DeepSeek V4.1: the V4.1 presets in every command (one vocabulary,
the preset table's), the default builders of the preset, the demo checking each step's
indexers (c1a, c2a), compressed KV and SWA against the reference, and the bench's
``--compare`` of presets side by side."""

from __future__ import annotations

import json

import pytest
import torch

import staticattn.reference.compressed as compressed_reference
import staticattn.reference.v41_compressed as v41_reference
from staticattn.__main__ import main
from staticattn.arena import ArenaConfig
from staticattn.bench.bench_report import BenchReport, BenchRow, HostGpu, Stat
from staticattn.bench.preset_compare import PresetComparison
from staticattn.builders import default_builders
from staticattn.cli import DCP_PRESETS, PRESETS
from staticattn.model import PRESETS as MODEL_PRESETS

CUDA = torch.cuda.is_available()

BAD = [
    (["bench", "--dcp", "2", "--preset", "deepseek-v4-vision"],
     "--preset deepseek-v4-vision: decode context parallelism does not serve it (its layer "
     "types or image spans); --dcp takes deepseek-v3.2, deepseek-v4, deepseek-v4.1-flash, "
     "deepseek-v4.1-large"),
    (["demo", "--dcp", "2", "--dcp-preset", "deepseek-v4-vision"],
     "argument --dcp-preset: invalid choice: 'deepseek-v4-vision'"),
    (["bench", "--mix", "--compare", "deepseek-v4.1-flash"],
     "--mix times fixed steps of its own: --compare would be ignored"),
    (["bench", "--context", "4096", "--compare", "deepseek-v4.1-flash"],
     "--context times fixed steps of its own: --compare would be ignored"),
    (["bench", "--compare", "deepseek-v4.2"], "argument --compare: invalid choice"),
    (["check", "--preset", "deepseek-v4.1-flash", "--max-model-len", "32"],
     "max_model_len=32 is below block_size=64"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_v41_argument_exits_2_naming_it(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1]


def test_one_vocabulary_of_presets():
    assert PRESETS == tuple(MODEL_PRESETS)
    assert {"deepseek-v4.1-flash", "deepseek-v4.1-large"} <= set(PRESETS)
    assert DCP_PRESETS == ("deepseek-v3.2", "deepseek-v4", "deepseek-v4.1-flash",
                           "deepseek-v4.1-large")


@pytest.mark.parametrize("preset, names", [
    ("deepseek-v4.1-flash", ["indexer.c1a", "indexer.c2a", "compressed", "swa"]),
    ("deepseek-v4.1-large", ["indexer.c1a", "indexer.c2a", "compressed", "swa"]),
    ("deepseek-v4", ["indexer", "compressed", "swa"]),
    ("deepseek-v3.2", ["indexer"]),
])
def test_the_commands_build_the_presets_default_builders(preset, names):
    cfg = ArenaConfig.preset(preset, device="cpu")
    assert [b.name for b in default_builders(cfg)] == names


@pytest.mark.skipif(CUDA, reason="without CUDA only: the GPU run measures")
@pytest.mark.parametrize("cmd", [["bench"], ["bench", "--compare", "deepseek-v4"]])
def test_bench_takes_the_v41_presets(cmd, capsys):
    """(``check`` on every preset: tests/test_commands_every_preset.py.)"""
    assert main([*cmd, "--preset", "deepseek-v4.1-large"]) == 3
    assert capsys.readouterr().out.startswith("SKIPPED: no CUDA device; ")


@pytest.mark.parametrize("preset", ["deepseek-v4.1-flash", "deepseek-v4.1-large"])
def test_the_v41_demo_checks_every_builder_against_the_reference(preset, capsys):
    assert main(["demo", "--preset", preset, "--steps", "3", "--no-progress", "--json"]) == 0
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert data["verdict"] == "PASS" and data["mismatches"] == 0
    assert data["reference_checked"] >= 1 and data["reference_mismatches"] == 0
    assert f"arena for the {preset} preset" in err
    assert ("builders indexer.c1a, indexer.c2a, compressed, swa" in err)
    assert ("reference builds (indexer.c1a, indexer.c2a, compressed, swa; field by field)"
            in err)


def test_the_v41_demo_fails_when_the_compressed_build_differs(monkeypatch, capsys):
    """The compressed check is live: a reference one slot off fails the demo, naming it."""
    expected = compressed_reference.expected

    def off(*args, **kwargs):
        want = expected(*args, **kwargs)
        want["c2a"]["slot_mapping"] = [s + 1 for s in want["c2a"]["slot_mapping"]]
        return want

    monkeypatch.setattr(compressed_reference, "expected", off)
    assert main(["demo", "--preset", "deepseek-v4.1-flash", "--steps", "2",
                 "--no-progress"]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("FAIL: 2 steps")
    assert any(line.startswith("first mismatch: compressed: c2a.slot_mapping[")
               for line in lines)


def test_the_v41_demo_fails_when_an_index_type_differs(monkeypatch, capsys):
    """Each index type is checked against its own reference (c2a: ratio 2, its table)."""
    indexer_metadata = v41_reference.indexer_metadata

    def off(cfg, v41, name, **kwargs):
        want = indexer_metadata(cfg, v41, name, **kwargs)
        if name == "c2a":
            want["slot_mapping"] = [s + 1 for s in want["slot_mapping"]]
        return want

    monkeypatch.setattr(v41_reference, "indexer_metadata", off)
    assert main(["demo", "--preset", "deepseek-v4.1-flash", "--steps", "1",
                 "--no-progress"]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("first mismatch: indexer.c2a: slot_mapping[") for line in lines)


def _report(preset: str, host: list[float], gpu: list[float],
            capture: list[float]) -> BenchReport:
    env = dict.fromkeys(("device", "driver", "cuda", "torch", "triton"), "-")
    report = BenchReport(env, preset, 2, "metadata only", None)
    for i, (h, g, c) in enumerate(zip(host, gpu, capture)):
        st = lambda x: Stat(x, x, x)  # noqa: E731
        report.rows.append(BenchRow(2 << i, 1 << i, 9, 12, HostGpu(st(h), st(g)),
                                    HostGpu(st(3 * h), st(3 * g)), capture_s=c))
    return report


def test_compare_sets_each_preset_beside_the_first_with_ratios():
    base = _report("deepseek-v4", [10.0, 20.0], [5.0, 8.0], [0.25, 0.5])
    other = _report("deepseek-v4.1-flash", [11.0, 19.0, 30.0], [6.0, 8.0, 9.0],
                    [0.5, 0.75, 1.0])
    cmp = PresetComparison([base, other])
    rows = cmp.ratios()
    # The third size has no base row: left out.
    assert [(r.num_reqs, r.host_ratio, r.gpu_ratio) for r in rows] == [
        (1, 1.1, 1.2), (2, 0.95, 1.0)]
    table = cmp.table().splitlines()
    assert table[2].split() == ["deepseek-v4.1-flash", "1", "|", "11.0", "10.0", "1.10", "|",
                                "6.0", "5.0", "1.20", "|", "0.500", "0.250"]
    data = json.loads(cmp.to_json())
    assert [r["preset"] for r in data["reports"]] == ["deepseek-v4", "deepseek-v4.1-flash"]
    assert data["ratios"][1]["host_ratio"] == pytest.approx(0.95)
    assert data["reports"][1]["rows"][0]["capture_s"] == 0.5
    assert cmp.text().count("preset deepseek-v4") == 2
