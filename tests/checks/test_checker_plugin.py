"""The pytest plugin: declared as a pytest11 entry point, skips cleanly without CUDA, and the
example project under examples/plugin_project runs as a user's suite would (a subprocess:
its eager test passes anywhere, its two graph-safety tests skip without CUDA and pass with
it)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch
from helpers.paths import ROOT

from staticattn.arena import ArenaConfig
from staticattn.checks import pytest_plugin
from staticattn.checks.pytest_plugin import GraphSafetyError, assert_graph_safe

EXAMPLE = ROOT / "examples" / "plugin_project"
PLUGIN = "staticattn.checks.pytest_plugin"


def test_entry_point_is_declared():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomli = pytest.importorskip("tomli")
        tomllib = tomli
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {"staticattn": PLUGIN}
    assert callable(pytest_plugin.pytest_addoption)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the skip path is the CPU path")
def test_assert_graph_safe_skips_without_cuda():
    cfg = ArenaConfig.deepseek_v4(max_model_len=1024, device="cpu")
    with pytest.raises(pytest.skip.Exception, match="needs a CUDA device"):
        assert_graph_safe(lambda batch, md: None, config=cfg)


def test_graph_safety_error_carries_the_report():
    from staticattn.checks import CheckReport, SizeCheck

    size = SizeCheck(8)
    size.add("sync", ".item() in the step")
    err = GraphSafetyError(CheckReport([size]))
    assert isinstance(err, AssertionError) and err.report.kinds("error") == {"sync"}
    assert "[sync] .item() in the step" in str(err) and "FAIL" in str(err)


def _plugin_registered() -> bool:
    return any(e.value == PLUGIN for e in entry_points(group="pytest11"))


def test_example_project_runs_as_a_users_suite(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    # Installed, the entry point loads the plugin; from a checkout, name it.
    load = [] if _plugin_registered() else ["-p", PLUGIN]
    json_dir = tmp_path / "reports"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *load,
         "--graph-safety-json", str(json_dir), "--graph-safety-batches", "5"],
        cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=900)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    if torch.cuda.is_available():
        assert "3 passed" in out, out[-4000:]
        assert len(list(json_dir.glob("*.json"))) == 2
    else:
        assert "1 passed, 2 skipped" in out and "needs a CUDA device" in out, out[-4000:]
        assert not json_dir.exists()


def test_example_project_in_a_fresh_virtualenv(tmp_path):
    """Installed the way a user installs it -- into a new virtualenv, offline, its
    dependencies (torch, pytest) and its installer (pip, setuptools) from the interpreter's
    own site -- the package registers
    the plugin through its pytest11 entry point: the example suite runs with no ``-p``."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(venv)], check=True, timeout=300)
    python = venv / ("Scripts" if os.name == "nt" else "bin") / "python"
    # This interpreter may itself be a virtualenv: hand its packages down (after the new
    # environment's own, which the install fills).
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path("
                           "'purelib'))"], capture_output=True, text=True, check=True).stdout
    # Every site directory this interpreter reads (a .pth inside one of them is not read
    # again from a listed directory: a virtualenv of a virtualenv would lose the grandparent's).
    # In this interpreter's order: a package its own environment holds (a newer setuptools,
    # say) shadows the one of the environment it was made from.
    parent = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib"), *(
        p for p in sys.path if p.endswith(("site-packages", "dist-packages")))])
    (Path(site.strip()) / "parent_site.pth").write_text("\n".join(parent) + "\n")
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", str(ROOT)], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout + install.stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                          cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=900)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert ("3 passed" if torch.cuda.is_available() else "1 passed, 2 skipped") in out, (
        out[-4000:])
    located = subprocess.run([str(python), "-c", "import staticattn; print(staticattn.__file__)"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert str(venv) in located.stdout, located.stdout + located.stderr


FIXTURE_WIRING = '''
from staticattn.checks import pytest_plugin


def test_fixture_passes_the_command_line_options(assert_graph_safe, monkeypatch):
    seen = []
    monkeypatch.setattr(pytest_plugin, "assert_graph_safe",
                        lambda step, **kwargs: seen.append(kwargs) or "report")
    assert assert_graph_safe("step", config="cfg") == "report"
    assert assert_graph_safe("step", config="cfg", batches=3) == "report"
    first, second = seen
    assert first["batches"] == 7 and second["batches"] == 3
    assert first["json_path"].name.endswith("-1.json")
    assert second["json_path"].name.endswith("-2.json")
    assert first["json_path"].parent.name == "reports"
    assert "test_fixture_passes_the_command_line_options" in first["json_path"].name
'''


def test_fixture_wiring_in_a_users_suite(tmp_path):
    (tmp_path / "test_wiring.py").write_text(FIXTURE_WIRING)
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    load = [] if _plugin_registered() else ["-p", PLUGIN]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *load,
         "--graph-safety-batches", "7", "--graph-safety-json", str(tmp_path / "reports")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr
