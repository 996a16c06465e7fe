#!/usr/bin/env bash
# Hopper GEMM benchmark on a CUDA sm_90 machine: the DeepGEMM shape table through the sm_90a
# TMA/wgmma kernels (crates/kernels/examples/bench_hopper.rs), beside cuBLAS through PyTorch
# (scripts/bench_torch.py) when torch is present, and `ptxforge bench gemm` (the host API).
# No GPU: prints skip lines. Logs in $OUT (or target/bench-hopper).
set -uo pipefail
cd "$(dirname "$0")/.."
LOG="${OUT:-target/bench-hopper}"
mkdir -p "$LOG"
DEV="${DEV:-cuda:0}"
timeout 300 cargo build --release -p kernels --example bench_hopper -p ptxforge-cli 2>&1 | tail -3
for dt in fp8 bf16; do
  echo "== hopper kernels ($dt)" | tee -a "$LOG/summary.log"
  timeout 300 cargo run --release -q -p kernels --example bench_hopper -- "$DEV" "$dt" 10 sweep 2>&1 | tee -a "$LOG/summary.log"
done
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "== cuBLAS via torch" | tee -a "$LOG/summary.log"
  for s in "4096 7168 16384" "4096 4096 7168" "4096 2112 7168" "4096 24576 1536" "128 7168 16384" "64 2112 7168"; do
    set -- $s
    for dt in fp8 bf16; do
      echo "$dt $1x$2x$3: $(timeout 120 python3 scripts/bench_torch.py --dtype $dt --m $1 --n $2 --k $3)" | tee -a "$LOG/summary.log"
    done
  done
else
  echo "skip: torch with CUDA not available (no cuBLAS comparison)" | tee -a "$LOG/summary.log"
fi
echo "== ptxforge bench gemm (host API)" | tee -a "$LOG/summary.log"
timeout 600 cargo run --release -q -p ptxforge-cli -- bench gemm --device "$DEV" --dtype fp8 2>&1 | tee -a "$LOG/summary.log"
echo "logs: $LOG"
