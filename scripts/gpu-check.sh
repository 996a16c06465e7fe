#!/usr/bin/env bash
# GPU check, on a machine with an NVIDIA GPU and driver (no CUDA toolkit needed). Runs (1) the
# runtime tests on the CUDA device (PTXFORGE_TEST_CUDA=1), its multicast objects and CUDA IPC across processes, (2) every library kernel's test shapes
# against its CPU reference on the GPU (`ptxforge kernels --check --device cuda`), (3) a small
# `ptxforge moe --device cuda`, also as one process per rank under `ptxforge launch`, (4) the Hopper GEMM benchmark (DeepGEMM shapes) and `ptxforge
# bench gemm` (which times cuBLAS through PyTorch on the same shapes when torch is there), (5)
# `ptxforge bench attn` (MLA attention training and decoding, beside torch SDPA), (6) NCCL
# (crates/netnccl: collectives, the non-blocking init/abort path, and with 2+ GPUs the NCCL
# engine of the EP proxy and a killed rank). Prints a
# table at the end; full logs go to $OUT (or target/gpu-check). Budget: under 8 minutes on one
# H200 (each step has a timeout).
#
# Two modes: with cargo, it builds in release and runs from source; without cargo (the lent GPU
# image has no Rust toolchain) it runs the binaries `scripts/gpu-pack.sh` built into .gpu/ —
# carry `.gpu` with the device call.
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
if command -v cargo >/dev/null; then
  step build 240 cargo build --release --workspace --all-targets
  PF=(cargo run --release -q -p ptxforge-cli --)
  PFBIN=target/release/ptxforge # what a launcher starts per rank
  BACKEND=(cargo test --release -p runtime --test backend --)
  MCAST=(cargo test --release -p runtime --test multicast --)
  IPC=(cargo test --release -p runtime --test ipc_procs --)
  BENCH=(cargo run --release -q -p kernels --example bench_hopper --)
  cargo build --release -q -p netnccl --bin netnccl-check >"$LOG/netnccl-build.log" 2>&1
  NCCLCHK=(target/release/netnccl-check)
elif [ -x .gpu/bin/ptxforge ]; then
  echo "no cargo: running the binaries of .gpu/ (commit $(cat .gpu/COMMIT 2>/dev/null); $(cat .gpu/GLIBC 2>/dev/null); here $(ldd --version 2>&1 | head -1))" | tee -a "$LOG/summary.log"
  PF=(.gpu/bin/ptxforge)
  PFBIN=.gpu/bin/ptxforge
  BACKEND=(.gpu/bin/runtime-backend-tests)
  MCAST=(.gpu/bin/runtime-multicast-tests)
  IPC=(.gpu/bin/runtime-ipc-procs-tests)
  BENCH=(.gpu/bin/bench_hopper)
  NCCLCHK=(.gpu/bin/netnccl-check)
else
  echo "no cargo and no .gpu/ binaries: run scripts/gpu-pack.sh where Rust is and carry .gpu" | tee -a "$LOG/summary.log"
  exit 2
fi
step devices 30 "${PF[@]}" devices
# Runtime: every backend test (the emulator ones too) with the CUDA tests enabled.
step runtime-cuda 120 "${BACKEND[@]}" --nocapture --test-threads=1
# Multicast objects (runtime::Multicast on up to 4 GPUs): multimem.ld_reduce/st/red kernels
# against exact references where the GPUs report CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED (an
# NVSwitch system), else the typed refusal. The emulated-device tests run too.
step multicast-cuda 60 "${MCAST[@]}" --nocapture --test-threads=1
# CUDA IPC across processes (cuIpcGetMemHandle / cuIpcOpenMemHandle): the test binary re-runs
# itself as a second process on device 0; st.release.sys / ld.acquire.sys message passing,
# .sys atomics from both processes, a bit-exact read of the other process's buffer.
step ipc-cuda 90 "${IPC[@]}" --nocapture --test-threads=1
# Every library kernel against its CPU reference on the GPU.
step kernels-cuda 150 "${PF[@]}" kernels --check --device cuda
# The main job on the GPU (one rank per GPU present: one here), small enough for the budget.
step moe-cuda 120 "${PF[@]}" moe --device cuda --nodes 1 --gpus-per-node 1 \
  --experts 8 --hidden 1024 --intermediate 512 --tokens 512 --topk 2 --groups 2 --topk-groups 1 --check-tokens 64
# The same moe as one rank per process (`ptxforge launch`, the TCP engine; docs/SCALE.md "On
# GPUs"): every hash equal to the single-process run's on the GPU. With 2+ GPUs, one node of 2
# processes (rank r on cuda:r) whose kernels write each other's buffers through CUDA IPC; with
# one GPU only the launched path (1 process, no peer). Not run: several nodes on CUDA and the
# NCCL engine, which the multi-process moe refuses (the proxy needs host views of device memory;
# the NCCL engine's rounds wait for the device's queued work and deadlock with the kernels).
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
gpn=1; [ "${ngpu:-1}" -ge 2 ] && gpn=2
[ "$gpn" = 1 ] && echo "note moe-cuda-procs: 1 GPU, so one process and no CUDA IPC peer (2+ GPUs needed)" | tee -a "$LOG/summary.log"
MOEP=(moe --device cuda --nodes 1 --gpus-per-node "$gpn" --experts 8 --hidden 1024 --intermediate 512
  --tokens 512 --topk 2 --groups 2 --topk-groups 1 --dump-hash --check-tokens 64)
step moe-cuda-procs 120 bash -c "set -o pipefail; $PFBIN $(printf '%q ' "${MOEP[@]}") | grep ^hash | sort > '$LOG/moe-single.txt' &&
  $PFBIN launch --nodes 1 --procs-per-node $gpn --no-prefix -- $PFBIN $(printf '%q ' "${MOEP[@]}") |
  grep ^hash | sort > '$LOG/moe-procs.txt' && [ -s '$LOG/moe-procs.txt' ] && diff '$LOG/moe-single.txt' '$LOG/moe-procs.txt'"
# Benchmarks: the Hopper kernels on the DeepGEMM table, and the host API's GEMM table beside
# cuBLAS (scripts/bench_torch.py).
step bench-hopper-fp8 120 "${BENCH[@]}" cuda:0 fp8 10 sweep
step bench-hopper-bf16 120 "${BENCH[@]}" cuda:0 bf16 10 sweep
step bench-gemm 120 "${PF[@]}" bench gemm --device cuda:0 --dtype fp8
# MLA attention: training fwd/bwd (2 x 4096 tokens, 16 heads, 192/128) beside torch SDPA, and
# paged decoding (64 x 4096 cached tokens, 128 heads, 512 + 64) in TFLOP/s and GB/s.
step bench-attn 120 "${PF[@]}" bench attn --device cuda:0
# NCCL (crates/netnccl; CI runs the same checks on the fake NCCL): the real libnccl.so.2 —
# from the system, or PyTorch's nvidia-nccl wheel — with the data-parallel collectives against
# the f64 host reference. One rank per GPU: NCCL refuses two ranks of one communicator on the
# same GPU ("Duplicate GPU detected"), so the one-H200 check machine runs a 1-rank communicator
# (every call goes through the real library and GPU, but nothing crosses a link); with 2+ GPUs
# it also runs 2 ranks, the proxy transport over the NCCL engine, and EP dispatch/combine
# against the single-process run. Faults: on one GPU the non-blocking communicator path
# (ncclCommInitRankConfig with blocking = 0, completion polled, ncclCommAbort) and a 2-rank
# init whose second rank never comes, which must be aborted after the 5 s timeout
# (`netnccl-check abort`); with 2+ GPUs also a rank SIGKILLed mid-all-reduce and
# mid-engine-round, which the survivor must report within seconds. (The multi-process
# `ptxforge moe` runs on emulated devices only: not here.)
if [ -z "${PTXFORGE_NCCL_LIB:-}" ]; then
  lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
  [ -n "$lib" ] && [ -f "$lib" ] && export PTXFORGE_NCCL_LIB="$lib"
fi
if [ ! -x "${NCCLCHK[0]}" ]; then
  echo "skip nccl: no netnccl-check binary" | tee -a "$LOG/summary.log"
elif "${NCCLCHK[@]}" unavailable >"$LOG/nccl-probe.log" 2>&1; then
  echo "skip nccl: $(tail -1 "$LOG/nccl-probe.log")" | tee -a "$LOG/summary.log"
else
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  step nccl-1rank 60 "${NCCLCHK[@]}" launch --nodes 1 --procs-per-node 1 -- \
    "${NCCLCHK[@]}" collectives --count 65536
  step nccl-abort 60 "${NCCLCHK[@]}" abort --nccl-timeout 5 --expect aborted
  if [ "${ngpu:-1}" -ge 2 ]; then
    step nccl-2ranks 60 "${NCCLCHK[@]}" launch --nodes 2 --procs-per-node 1 -- \
      "${NCCLCHK[@]}" collectives --count 65536
    step nccl-proxy 60 "${NCCLCHK[@]}" launch --nodes 2 --procs-per-node 1 -- "${NCCLCHK[@]}" proxy
    # the job must fail (rank 1 killed) with rank 0 stopping by itself, naming the operation
    # (a real NCCL may not notice a dead peer on NVLink: then its 10 s timeout aborts)
    for op in all-reduce engine; do
      step "nccl-kill-$op" 60 bash -c "out=\$('${NCCLCHK[0]}' launch --nodes 2 --procs-per-node 1 \
        --timeout 20 -- '${NCCLCHK[0]}' fault --op $op --kind kill --nccl-timeout 10 2>&1);
        rc=\$?; echo \"\$out\"; [ \$rc -ne 0 ] &&
        grep -qE 'rank 0: stopped after .*NCCL (all_reduce|engine round) failed' <<<\"\$out\""
    done
    step nccl-ep 120 bash -c "'${NCCLCHK[0]}' ep --single --seed 5 | grep ^hash | sort > '$LOG/ep-single.txt' &&
      '${NCCLCHK[0]}' launch --nodes 2 --procs-per-node 1 --no-prefix -- '${NCCLCHK[0]}' ep --seed 5 |
      grep ^hash | sort > '$LOG/ep-nccl.txt' && diff '$LOG/ep-single.txt' '$LOG/ep-nccl.txt'"
  fi
fi
# The Python package's CUDA path (python/tests/test_cuda.py: arrays in CUDA memory,
# __cuda_array_interface__, launches through the driver, torch reading them when torch has
# CUDA): needs python3 with numpy and pytest, and the package — built here with maturin, or the
# wheel `GPU_PACK_PYTHON=1 scripts/gpu-pack.sh` put in .gpu/wheels.
whl=$(ls .gpu/wheels/ptxforge-*.whl 2>/dev/null | head -1)
if [ -z "$whl" ] && command -v maturin >/dev/null && command -v cargo >/dev/null; then
  maturin build --release -q -m python/Cargo.toml -o "$LOG/wheels" >"$LOG/wheel.log" 2>&1 &&
    whl=$(ls "$LOG"/wheels/ptxforge-*.whl 2>/dev/null | head -1)
fi
if [ -n "$whl" ] && python3 -c 'import numpy, pytest' 2>/dev/null; then
  step python-cuda 120 bash -c "python3 -m venv --system-site-packages '$LOG/venv' &&
    '$LOG/venv/bin/pip' install -q --no-deps --force-reinstall '$whl' &&
    '$LOG/venv/bin/python' -m pytest -q -rs python/tests/test_cuda.py"
else
  echo "skip python-cuda: no ptxforge wheel or no python3 with numpy and pytest" | tee -a "$LOG/summary.log"
fi

echo
printf '%-18s %-10s %s\n' STEP STATUS TIME | tee -a "$LOG/summary.log"
fail=0
for i in "${!NAMES[@]}"; do
  printf '%-18s %-10s %s\n' "${NAMES[$i]}" "${STATUS[$i]}" "${TIMES[$i]}" | tee -a "$LOG/summary.log"
  [ "${STATUS[$i]}" = ok ] || fail=1
done
echo "cuda tests passed: $(grep -c '^test .*cuda.* ok$' "$LOG"/runtime-cuda.log 2>/dev/null)" | tee -a "$LOG/summary.log"
echo "multicast: $(grep -hoE 'multicast reduce/broadcast/red ok on [0-9]+ devices|multicast unsupported: .{0,60}' "$LOG"/multicast-cuda.log 2>/dev/null | head -1)" | tee -a "$LOG/summary.log"
grep -h "checks on" "$LOG"/kernels-cuda.log 2>/dev/null | tee -a "$LOG/summary.log"
echo "skipped lines: $(grep -h '^skip' "$LOG"/*.log 2>/dev/null | sort | uniq -c | tr '\n' ';')" | tee -a "$LOG/summary.log"
echo "logs: $LOG"
exit $fail
