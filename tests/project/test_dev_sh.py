"""``./dev.sh`` leaves a user's install as it was: it works in ``.venv`` inside the clone,
installs nothing elsewhere, and never installs staticattn itself (no editable install whose
loss would break the package when the clone goes).

The user here: a virtualenv holding a regular install of staticattn (the wheel of this
clone) and a tqdm too old for staticattn (its metadata says 0.0.1); ``PYTHON`` points
``dev.sh`` at it, as a user's ``python3`` would be, and a copy of the clone runs ``./dev.sh
demo``, which installs a newer tqdm (a local wheel: no index is reached) into ``.venv``."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from helpers.doc_blocks import ROOT

#: pip never reaches an index here: what it installs is a local wheel.
PIP_OFFLINE = {**os.environ, "PIP_NO_INDEX": "1"}

#: What the copy of the clone leaves out: git's and the builds' own folders.
SKIP = shutil.ignore_patterns(".git", ".venv", "__pycache__", "build", "*.egg-info", "_build",
                              ".pytest_cache", ".hypothesis", ".benchmarks", ".ruff_cache")


def _snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with the hash of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def _metadata_wheel(folder: Path, name: str, version: str) -> Path:
    """A wheel of distribution ``name`` holding its metadata only (its module stays the
    installed one): what ``dev.sh`` installs, offline."""
    dist = f"{name}-{version}.dist-info"
    files = {f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{dist}/RECORD"])
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return wheel


def _user_env(tmp_path: Path, source: Path) -> tuple[Path, Path]:
    """A virtualenv with a regular (non-editable) install of staticattn, built from
    ``source``, that finds the packages this test's Python finds (torch...): its python and
    its site-packages."""
    venv = tmp_path / "user-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig."
                                "get_path('purelib'))"], capture_output=True, text=True,
                               check=True).stdout.strip())
    (site / "_shared.pth").write_text("\n".join(
        p for p in sys.path if p.endswith(("site-packages", "dist-packages"))) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp_path / "dist"), str(source)],
                   check=True, env=PIP_OFFLINE)
    wheel = next((tmp_path / "dist").glob("staticattn-*.whl"))
    old_tqdm = _metadata_wheel(tmp_path / "old", "tqdm", "0.0.1")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel),
                    str(old_tqdm)], check=True, env=PIP_OFFLINE)
    return python, site


def test_dev_sh_leaves_a_regular_install_untouched(tmp_path):
    clone = tmp_path / "clone"
    shutil.copytree(ROOT, clone, ignore=SKIP)
    python, site = _user_env(tmp_path, clone)
    before = _snapshot(tmp_path / "user-venv")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    wheels = _metadata_wheel(tmp_path / "wheels", "tqdm", "4.99.0").parent
    done = subprocess.run(["./dev.sh", "demo", "--steps", "1", "--no-progress", "--preset",
                           "deepseek-v3.2"], cwd=clone, capture_output=True, text=True,
                          timeout=600, env={**env, "PIP_NO_INDEX": "1", "PYTHON": str(python),
                                            "PIP_FIND_LINKS": str(wheels)})
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    lines = out.strip().splitlines()
    assert lines[0].startswith("dev.sh: creating .venv (a virtualenv inside this clone"), out
    assert lines[1] == "dev.sh: installing into .venv (nothing else changes): tqdm>=4.60", out
    assert lines[-1].startswith("PASS: 1 steps")
    # The user's environment holds the same files, byte for byte; the clone got .venv.
    assert _snapshot(tmp_path / "user-venv") == before
    assert list((clone / ".venv").rglob("tqdm-4.99.0.dist-info"))  # the install went there
    assert not list(site.glob("__editable__*")) and not list(site.glob("*.egg-link"))
    # The clone gone, the installed package still imports and runs, from its own place.
    shutil.rmtree(clone)
    done = subprocess.run([str(python), "-c", "import staticattn.demo, staticattn; "
                           "print(staticattn.__file__)"], cwd=tmp_path, capture_output=True,
                          text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(site)), done.stdout


def test_dev_venv_is_ignored_by_git():
    done = subprocess.run(["git", "check-ignore", "-q", ".venv/bin/python"], cwd=ROOT)
    assert done.returncode == 0


def test_dev_env_lists_what_is_missing(tmp_path):
    """What ``dev.sh`` would install: the unmet requirements of the groups asked for, torch
    never (a CPU build is installed apart), nothing when all are met."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import dev_env
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[build-system]\nrequires = ["setuptools>=1"]\n[project]\nname = "x"\n'
        'dependencies = ["torch>=99", "numpy>=1", "no-such-package-here>=1"]\n'
        '[project.optional-dependencies]\ntest = ["pytest>=999"]\n')
    wanted = dev_env.requirements(["test", "build"], pyproject)
    assert list(dev_env.unmet(wanted)) == ["no-such-package-here>=1", "pytest>=999"]
    # The tests run: what the test group needs is here (the docs group is installed by
    # `./dev.sh docs` alone).
    assert list(dev_env.unmet(dev_env.requirements(["test"]))) == []
