#!/usr/bin/env bash
# The soak and the sanitizers of every preset on one GPU, results into a directory:
#
#   scripts/gpu_soak_all.sh OUTDIR            # soak, then sanitize
#   scripts/gpu_soak_all.sh soak OUTDIR       # scripts/soak.py --every-kind, 100,000 steps a preset
#   scripts/gpu_soak_all.sh sanitize OUTDIR   # memcheck and racecheck over scripts/sanitize_loop.py
#   scripts/gpu_soak_all.sh stateful OUTDIR   # the GPU state machine, 5,000 steps a preset
#
# Each stage runs its presets side by side, one process each (the soak's host work is one
# core's; the GPU is mostly idle between replays), each under a time limit. Per run: its
# output in OUTDIR/<run>.txt (the soak's report also in OUTDIR/soak_<preset>.json) and one
# line in OUTDIR/summary.txt, printed as it ends. Exit status 0 only when every run passed.
# Environment: PYTHON (default python3), REPLAYS (100000), SAMPLE (20: one in 20 of each
# kind's replays compared with the eager reference), STEPS (5000), SOAK_LIMIT_S (480),
# SANITIZE_LIMIT_S (240), STATEFUL_LIMIT_S (570), PRESETS_ONLY (all four); DEVICE=cpu: the
# soak and the loop at small capacities, graphs emulated (a smoke test without a GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  soak|sanitize|stateful|all) MODE=$1; shift ;;
  *) MODE=all ;;
esac
OUT=${1:?usage: scripts/gpu_soak_all.sh [soak|sanitize|stateful|all] OUTDIR}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PRESETS=(deepseek-v3.2 deepseek-v4 deepseek-v4.1-flash deepseek-v4-vision)
# PRESETS_ONLY="P ...": these presets alone (e.g. half of them on each of two GPUs).
[ -n "${PRESETS_ONLY:-}" ] && read -r -a PRESETS <<<"$PRESETS_ONLY"
FAILED=0

# run NAME LIMIT_S SUMMARY_PATTERN CMD...: CMD's output into OUT/NAME.txt, then its line.
run() {
  local name=$1 limit=$2 pattern=$3 start=$SECONDS rc line
  shift 3
  timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
  rc=$?
  line=$(grep -E "$pattern" "$OUT/$name.txt" | tail -n 1)
  local verdict=PASS
  if [ "$rc" -eq 124 ]; then verdict="TIMEOUT after ${limit} s"; elif [ "$rc" -ne 0 ]; then verdict="FAIL (exit $rc)"; fi
  printf '%-28s %s in %d s: %s\n' "$name" "$verdict" $((SECONDS - start)) "${line:-no summary line}" \
    | tee -a "$OUT/summary.txt"
  [ "$rc" -eq 0 ]
}

# wait_all: wait for every background run; FAILED=1 when one failed.
wait_all() {
  local pid
  for pid in $(jobs -p); do wait "$pid" || FAILED=1; done
}

soak() {
  for p in "${PRESETS[@]}"; do
    run "soak_$p" "${SOAK_LIMIT_S:-480}" '^soak ' \
      "$PY" scripts/soak.py --every-kind --preset "$p" --replays "${REPLAYS:-100000}" \
      --sample "${SAMPLE:-20}" --max-model-len 65536 --device "${DEVICE:-cuda}" \
      --json "$OUT/soak_$p.json" &
  done
  wait_all
}

sanitize() {
  local tool p
  for tool in memcheck racecheck; do
    local flags=(--tool "$tool" --error-exitcode 3)
    [ "$tool" = memcheck ] && flags+=(--report-api-errors no)
    for p in "${PRESETS[@]}"; do
      run "${tool}_$p" "${SANITIZE_LIMIT_S:-240}" 'ERROR SUMMARY|RACECHECK SUMMARY|FAILED' \
        compute-sanitizer "${flags[@]}" "$PY" scripts/sanitize_loop.py --preset "$p" \
        --device "${DEVICE:-cuda}" &
    done
  done
  wait_all
}

stateful() {
  export STATICATTN_STATEFUL_STEPS=${STEPS:-5000}
  for p in "${PRESETS[@]}"; do
    run "stateful_$p" "${STATEFUL_LIMIT_S:-570}" \
      ' (passed|failed|error)' "$PY" -m pytest -q -p no:cacheprovider -rfE \
      "tests/graphs/test_stateful_api_gpu.py::test_public_api_against_the_oracle_on_the_gpu[$p]" &
  done
  wait_all
}

echo "# scripts/gpu_soak_all.sh $MODE at $(git rev-parse --short HEAD 2>/dev/null), $(date -u +%FT%TZ)" \
  | tee -a "$OUT/summary.txt"
"$PY" -c 'import torch; print("#", torch.cuda.get_device_name() if torch.cuda.is_available()
else "no CUDA device", "torch", torch.__version__)' \
  2>&1 | tee -a "$OUT/summary.txt"
case $MODE in
  soak) soak ;;
  sanitize) sanitize ;;
  stateful) stateful ;;
  all) soak; sanitize ;;
esac
echo "# $MODE: $([ "$FAILED" -eq 0 ] && echo PASS || echo FAIL) in $SECONDS s" | tee -a "$OUT/summary.txt"
exit "$FAILED"
