#!/usr/bin/env bash
# The accelerators issue's checks in one call of a lent GPU (experiments/device_bench.py's parts,
# each in its own process under its own time limit, so that one slow part cannot take the rest):
#
#   OUT=/some/dir bash experiments/device_run.sh
#
# Writes <part>.json and one log under $OUT (at most 8 files come back from a lent machine).
# PARTS picks and orders the stages (default: all but small_k, in the order below; a 15-minute
# lease fits about two calls of 5-6 minutes, e.g. PARTS="networks small_k steps", then
# PARTS="compile proxy tests"; small_k times kron_fd with k = 12, every eigh then at most
# 32 x 32). SKETCHOPT_BATCHED_SOLVES defaults to 1 here (the default on a GPU anyway); WIDTHS,
# DIMS, STEPS and LIMIT_SCALE shrink or stretch it (a dry run on the CPU). The compile stage
# compiles the 24-layer model three times, each in its own process: cold, again from JAX's
# persistent compilation cache, and cold with XLA's GPU autotuner off. Limits from the H200 run
# of 2026-11-28 (docs/benchmarks/device.md): a kron_fd program compiles in about a minute there.
set -u
OUT=${OUT:-/tmp/device_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 SKETCHOPT_BATCHED_SOLVES=${SKETCHOPT_BATCHED_SOLVES:-1}
PY=${PYTHON:-python3}
SCALE=${LIMIT_SCALE:-1}
CACHE=$(mktemp -d)
LOG="$OUT/device.log"

stage() {  # name, seconds, command...
    local name=$1 limit=$(($2 * SCALE))
    shift 2
    echo "=== $name (limit ${limit} s) $(date -u +%T)" | tee -a "$LOG"
    timeout "$limit" "$@" >"$OUT/stage.txt" 2>&1
    local rc=$?
    cat "$OUT/stage.txt" >>"$LOG"
    grep -E '^\[|passed|failed|FAILED|Error' "$OUT/stage.txt" | tail -n 40
    rm -f "$OUT/stage.txt"
    echo "=== $name rc $rc $(date -u +%T)" | tee -a "$LOG"
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true; } | tee -a "$LOG"
bench=(experiments/device_bench.py --steps "${STEPS:-30}")
run_networks() {
    stage networks 300 "$PY" "${bench[@]}" --parts networks --widths "${WIDTHS:-128,256,1024}" \
        --out "$OUT/networks.json"
}
run_small_k() {  # kron_fd(k = 12): every eigh at most 32 x 32, one cuSOLVER launch each level
    stage networks 120 "$PY" "${bench[@]}" --parts networks --widths 128 --sketch-size 12 \
        --out "$OUT/networks_k12.json"
}
run_steps() {
    stage steps 80 "$PY" "${bench[@]}" --parts steps --dims "${DIMS:-1e6,1e7}" \
        --out "$OUT/steps.json"
}
run_compile() {
    stage compile 130 env JAX_COMPILATION_CACHE_DIR="$CACHE" "$PY" "${bench[@]}" \
        --parts compile --out "$OUT/compile_cold.json"
    stage compile 40 env JAX_COMPILATION_CACHE_DIR="$CACHE" "$PY" "${bench[@]}" \
        --parts compile --out "$OUT/compile_cached.json"
    stage compile 40 env XLA_FLAGS="--xla_gpu_autotune_level=0" "$PY" "${bench[@]}" \
        --parts compile --out "$OUT/compile_no_autotune.json"
}
run_proxy() {
    stage proxy 150 "$PY" "${bench[@]}" --parts proxy --paths backend --out "$OUT/proxy.json"
}
run_tests() {
    stage tests 200 env SKETCHOPT_TEST_XLA_OPT=default "$PY" -m pytest -q -p no:cacheprovider \
        tests/test_solvers.py tests/test_arrowhead.py
}
for part in ${PARTS:-networks steps compile proxy tests}; do
    "run_$part"
done
