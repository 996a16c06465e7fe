#!/usr/bin/env bash
# GPU check: on a machine with an NVIDIA GPU and driver (no CUDA toolkit needed), builds in
# release and runs (1) the runtime tests on the CUDA device, (2) every cargo test whose name
# contains `cuda` in every crate (library kernels against their CPU references), (3) a small
# `ptxforge moe --device cuda`, (4) the benchmarks that exist. Prints a table at the end; full logs go to $OUT (or target/gpu-check).
# Budget: under 8 minutes on one H200 (each step has a timeout).
set -uo pipefail
cd "$(dirname "$0")/.."
LOG="${OUT:-target/gpu-check}"
mkdir -p "$LOG"
export PTXFORGE_TEST_CUDA=1
export PTXFORGE_CACHE="${PTXFORGE_CACHE:-$LOG/cubin-cache}"
declare -a NAMES STATUS TIMES

step() { # name timeout_s command...
  local name="$1" limit="$2"; shift 2
  local t0=$(date +%s)
  echo "== $name: $*" | tee -a "$LOG/summary.log"
  timeout "$limit" "$@" >"$LOG/$name.log" 2>&1
  local rc=$?
  local st=ok; [ $rc -eq 124 ] && st=TIMEOUT; [ $rc -ne 0 ] && [ $rc -ne 124 ] && st="FAIL($rc)"
  NAMES+=("$name"); STATUS+=("$st"); TIMES+=("$(( $(date +%s) - t0 ))s")
  tail -5 "$LOG/$name.log"
}

if command -v nvidia-smi >/dev/null; then nvidia-smi >"$LOG/nvidia-smi.log" 2>&1; fi
step build 240 cargo build --release --workspace --all-targets
step devices 30 cargo run --release -q -p ptxforge-cli -- devices
# Runtime: every test (emulator ones too) with the CUDA module enabled.
step runtime-cuda 120 cargo test --release -p runtime -- --nocapture --test-threads=1
# Every other crate: the tests tagged for CUDA (name contains `cuda`).
step cuda-tagged 150 cargo test --release --workspace --exclude runtime -- cuda --nocapture
# The main job on the GPU (one rank per GPU present: one here), small enough for the budget.
step moe-cuda 120 ./target/release/ptxforge moe --device cuda --nodes 1 --gpus-per-node 1 \
  --experts 8 --hidden 1024 --intermediate 512 --tokens 512 --topk 2 --groups 2 --topk-groups 1 --check-tokens 64
# Benchmarks that exist (harness=false benches run once, quickly, in test mode).
step benches 120 cargo bench --workspace --no-fail-fast -- --test

echo
printf '%-14s %-10s %s\n' STEP STATUS TIME | tee -a "$LOG/summary.log"
fail=0
for i in "${!NAMES[@]}"; do
  printf '%-14s %-10s %s\n' "${NAMES[$i]}" "${STATUS[$i]}" "${TIMES[$i]}" | tee -a "$LOG/summary.log"
  [ "${STATUS[$i]}" = ok ] || fail=1
done
echo "cuda tests run: $(grep -hc '^test .*cuda.* ok$' "$LOG"/runtime-cuda.log "$LOG"/cuda-tagged.log 2>/dev/null | paste -sd+ | bc 2>/dev/null)" | tee -a "$LOG/summary.log"
echo "skipped lines: $(grep -h '^skip:' "$LOG"/*.log 2>/dev/null | sort | uniq -c | tr '\n' ';')" | tee -a "$LOG/summary.log"
echo "logs: $LOG"
exit $fail
