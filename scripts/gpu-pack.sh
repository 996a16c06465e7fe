#!/usr/bin/env bash
# Builds, here, everything scripts/gpu-check.sh runs on a GPU machine that has a driver but no
# Rust toolchain (the lent H200 image has none), into .gpu/ (git-ignored): the `ptxforge`
# binary, the runtime's backend, multicast and cross-process IPC test binaries (CUDA tests enabled by
# PTXFORGE_TEST_CUDA=1) and the
# Hopper GEMM benchmark. Profile `gpu` = release without debug info, stripped, so the folder
# fits the device tool's 64 MiB carry limit together with the working tree.
# Then: device run with carry [".gpu"] and command `OUT=$OUT scripts/gpu-check.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --profile gpu -p ptxforge-cli --bin ptxforge
cargo build --profile gpu -p kernels --example bench_hopper
json=$(cargo test --profile gpu -p runtime --test backend --test multicast --test ipc_procs --no-run --message-format=json 2>/dev/null)
test_exe() { # the executable of test target $1 in $json
  printf '%s\n' "$json" | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$1"
}
backend=$(test_exe backend)
multicast=$(test_exe multicast)
ipc=$(test_exe ipc_procs)
rm -rf .gpu && mkdir -p .gpu/bin
cp target/gpu/ptxforge .gpu/bin/
cp target/gpu/examples/bench_hopper .gpu/bin/
cp "$backend" .gpu/bin/runtime-backend-tests
cp "$multicast" .gpu/bin/runtime-multicast-tests
cp "$ipc" .gpu/bin/runtime-ipc-procs-tests
strip .gpu/bin/* 2>/dev/null || true
# GPU_PACK_PYTHON=1: the Python package's wheel too (gpu-check.sh's python-cuda step)
if [ "${GPU_PACK_PYTHON:-0}" = 1 ]; then
  maturin build --profile gpu -q -m python/Cargo.toml -o .gpu/wheels
fi
git rev-parse HEAD > .gpu/COMMIT
du -sh .gpu/bin/*
# the binaries link glibc dynamically (libcuda is dlopen'ed): the GPU image's glibc must be at
# least the newest version they reference (gpu-check.sh prints the image's)
need=$(objdump -T .gpu/bin/* 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -Vu | tail -1)
echo "needs ${need:-GLIBC (unknown)}; built with $(ldd --version | head -1)" | tee .gpu/GLIBC
total=$(( $(du -sb .gpu | cut -f1) + $(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) ))
echo "carry size with the working tree: $((total / 1048576)) MiB (limit 64)"
[ "$total" -lt $((62 * 1048576)) ] || { echo "too large to carry"; exit 1; }
