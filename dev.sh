#!/usr/bin/env bash
# Quick start from a clean clone: `./dev.sh demo` runs the demo, `./dev.sh test` the tests.
# `./dev.sh installed` checks the package as a user installs it (wheel, fresh virtualenv).
# On a machine with a GPU, `./dev.sh gpu-check` runs the tests and then the GPU extras.
# `./dev.sh docs` builds the guides and the API reference (warnings are errors).
# Installs only what is missing, and never replaces an installed torch.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}

ensure_deps() {
  if ! "$PY" -c "import torch" 2>/dev/null; then
    # A CPU build: the default wheel on PyPI pulls several GB of CUDA libraries.
    "$PY" -m pip install -q torch==2.13.0 || \
      "$PY" -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
  fi
  if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    # Triton's CPU interpreter (how CPU runs Triton kernels) needs >= 3.8 with numpy >= 2.4.
    "$PY" -c "import triton, sys; v=tuple(map(int, triton.__version__.split('.')[:2])); sys.exit(v < (3, 8))" \
      2>/dev/null || "$PY" -m pip install -q "triton>=3.8"
  fi
  "$PY" -c "import staticattn, pytest, hypothesis, pytest_benchmark, xdist" 2>/dev/null || \
    "$PY" -m pip install -q -e ".[test]"
}

# What a user installs, checked as installed: the wheel, built and installed into a fresh
# virtualenv that borrows the site's packages (torch is not downloaded again), then the
# installed demo run from outside the clone (every step checked against the reference that
# ships with the package) and the plugin project's tests run with the installed plugin.
installed_check() {
  local work venv
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  venv="$work/venv"
  "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$work/dist" .
  "$PY" -m venv --system-site-packages "$venv"
  "$venv/bin/python" -m pip install -q --no-deps --no-index "$work"/dist/staticattn-*.whl
  cp -r examples/plugin_project "$work/plugin_project"
  (
    cd "$work"
    "$venv/bin/python" -c "import staticattn, sys; p = staticattn.__file__; print('installed:', p); sys.exit(not p.startswith('$venv'))"
    "$venv/bin/staticattn" demo --no-progress --json demo.json
    "$venv/bin/python" -c "import json, sys; d = json.load(open('demo.json')); print('demo:', d['verdict'], d['steps'], 'steps,', d['reference_checked'], 'checked against the reference'); sys.exit(not (d['verdict'] == 'PASS' and d['reference_checked'] > 0))"
    cd plugin_project
    "$venv/bin/python" -m pytest -q -p no:cacheprovider
  )
}

cmd=${1:-}
shift || true
case "$cmd" in
  demo) ensure_deps; exec "$PY" -m staticattn demo "$@" ;;
  # One process per core, at most 8: the interpreted Triton tests dominate a CPU run.
  test) ensure_deps; exec "$PY" -m pytest -n auto --maxprocesses=8 --dist worksteal "$@" ;;
  installed) ensure_deps; installed_check ;;
  gpu-check) ensure_deps; exec "$PY" scripts/gpu_check.py "$@" ;;
  docs)
    ensure_deps
    "$PY" -c "import sphinx, myst_parser" 2>/dev/null || "$PY" -m pip install -q -e ".[docs]"
    exec "$PY" -m sphinx -W --keep-going -b html docs docs/_build/html "$@" ;;
  *) echo "usage: ./dev.sh demo|test|installed|gpu-check|docs [args...]" >&2; exit 2 ;;
esac
