#!/usr/bin/env bash
# Runs a command against the fake CUDA driver (crates/fakecuda: the driver API on the emulator):
#   scripts/fakecuda.sh cargo test -p runtime --test backend -- --test-threads=1
#   scripts/fakecuda.sh target/debug/ptxforge kernels --check --device cuda
# Builds the cdylib, copies it into a fresh temporary directory as libcuda.so and libcuda.so.1
# (and as libnccl.so / libnccl.so.2: the same library exports the fake NCCL, crates/fakecuda/src/nccl),
# and runs the command with that directory first on LD_LIBRARY_PATH and PTXFORGE_TEST_CUDA=1.
# (It is never named libcuda.so inside target/: cargo puts target/*/deps on the loader path of
# tests, and a fake libcuda there would hide the real driver / the "no driver" behaviour.)
# Env: PTXFORGE_FAKECUDA_DEVICES (default 2), PTXFORGE_FAKECUDA_TRACE=1 (say why calls fail),
# PTXFORGE_CACHE (defaults to a fresh directory here, so cubins of a real GPU are not reused).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
cargo build --quiet --manifest-path "$root/Cargo.toml" -p fakecuda
lib="$target/debug/libptxforge_fakecuda.so"
[ -f "$lib" ] || { echo "fakecuda.sh: $lib was not built" >&2; exit 1; }
dir="$(mktemp -d "${TMPDIR:-/tmp}/fakecuda.XXXXXX")"
trap 'rm -rf "$dir"' EXIT
# one file behind every name (symbolic links): the dynamic loader maps it once, so the fake
# NCCL sees the fake driver's memory (two copies would be two emulators)
cp "$lib" "$dir/libptxforge_fakecuda.so"
for name in libcuda.so libcuda.so.1 libnccl.so libnccl.so.2; do
  ln -s libptxforge_fakecuda.so "$dir/$name"
done
mkdir -p "$dir/cache"
export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PTXFORGE_TEST_CUDA=1
export PTXFORGE_CACHE="${PTXFORGE_CACHE:-$dir/cache}"
unset PTXFORGE_NO_CUDA
"$@"
