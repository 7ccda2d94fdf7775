#!/usr/bin/env bash
# Quick start from a clean clone: `./dev.sh demo` runs the demo, `./dev.sh test` the tests.
# `./dev.sh installed` checks the package as a user installs it (wheel, fresh virtualenv).
# On a machine with a GPU, `./dev.sh gpu-check` runs the tests and then the GPU extras.
# `./dev.sh docs` builds the guides and the API reference (warnings are errors).
#
# Every command runs in .venv, a virtualenv inside this clone (ignored by git) that finds
# every package of the Python that made it ($PYTHON, default python3): an installed torch is
# reused, never replaced. What a command needs and that Python lacks is installed into .venv
# only, each install announced first (scripts/dev_env.py lists it from pyproject.toml);
# where there is no torch at all, a CPU build (torch==2.13.0+cpu), never a CUDA one.
# Nothing is installed anywhere else, and staticattn itself is never installed: the commands
# run this clone's code from its root. `rm -r .venv` undoes it all.
set -euo pipefail
cd "$(dirname "$0")"
BASE=${PYTHON:-python3}
VENV=.venv
PY=$VENV/bin/python

# share_packages FROM_PY VENV: VENV's Python finds every package FROM_PY finds, through a .pth
# file (--system-site-packages alone reaches the base interpreter's, not a virtualenv's).
share_packages() {
  local site
  site=$("$2/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  "$1" -c 'import sys; print("\n".join(p for p in sys.path if p.endswith(("site-packages", "dist-packages"))))' \
    > "$site/_dev_sh_shared.pth"
}

make_venv() {
  [ -x "$PY" ] && return
  echo "dev.sh: creating $VENV (a virtualenv inside this clone, ignored by git) that finds the packages of $BASE"
  "$BASE" -m venv --system-site-packages --without-pip "$VENV"
  share_packages "$BASE" "$VENV"
}

# ensure GROUP...: what the command needs (scripts/dev_env.py), installed into .venv if missing.
ensure() {
  make_venv
  local groups=("$@") missing device=0
  # 0: CUDA, 1: no CUDA, 2: no torch.
  "$PY" -c 'import sys
try:
    import torch
except ImportError:
    sys.exit(2)
sys.exit(0 if torch.cuda.is_available() else 1)' || device=$?
  if [ "$device" = 2 ]; then
    echo "dev.sh: no torch here; installing torch==2.13.0+cpu (a CPU build) into $VENV"
    "$PY" -m pip install -q "torch==2.13.0+cpu" || \
      "$PY" -m pip install -q "torch==2.13.0+cpu" --index-url https://download.pytorch.org/whl/cpu
  fi
  [ "$device" = 0 ] || groups+=(cpu-interpreter)
  missing=$("$PY" scripts/dev_env.py "${groups[@]}")
  if [ -n "$missing" ]; then
    echo "dev.sh: installing into $VENV (nothing else changes):" $missing
    # shellcheck disable=SC2086  # one requirement per word
    "$PY" -m pip install -q $missing
  fi
}

# What a user installs, checked as installed: the wheel, built and installed into a fresh
# virtualenv that finds .venv's packages (torch is not downloaded again), then the
# installed demo run from outside the clone (every step checked against the reference that
# ships with the package) and the plugin project's tests run with the installed plugin.
installed_check() {
  local work venv
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  venv="$work/venv"
  "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$work/dist" .
  "$BASE" -m venv --without-pip "$venv"
  share_packages "$PY" "$venv"
  "$venv/bin/python" -m pip install -q -I --no-deps --no-index "$work"/dist/staticattn-*.whl
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
  demo) ensure; exec "$PY" -m staticattn demo "$@" ;;
  # One process per core (at most 16): on a CPU the interpreted Triton tests dominate; on a
  # GPU host the processes share the device, whose tests' work is light.
  # The build system's requirements too: a test installs the clone as a user would.
  test) ensure test build; exec "$PY" -m pytest -n auto --maxprocesses=16 --dist worksteal "$@" ;;
  installed) ensure test build; installed_check ;;
  gpu-check) ensure test; exec "$PY" scripts/gpu_check.py "$@" ;;
  docs) ensure docs; exec "$PY" -m sphinx -W --keep-going -b html docs docs/_build/html "$@" ;;
  *) echo "usage: ./dev.sh demo|test|installed|gpu-check|docs [args...]" >&2; exit 2 ;;
esac
