#!/usr/bin/env bash
# Installs what the tests need (ptxas into .tools/; a Python venv for python/tests) and runs every
# test: the Rust workspace, then the Python package (scripts/test-python.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x scripts/setup-ptxas.sh ]; then
  scripts/setup-ptxas.sh
fi
# the fake CUDA driver (a cdylib, which `cargo test` does not build as such) and the Hopper
# benchmark example (`--all-targets` builds examples as test harnesses) for the tests that run
# them on the fake driver; they would otherwise build them into a separate target directory
# tests that need ptxas fail (instead of skipping) when it is missing
export PTXFORGE_REQUIRE_PTXAS=1
cargo build -p fakecuda
cargo build -p kernels --example bench_hopper
cargo test --workspace --all-targets -- --test-threads="${TEST_THREADS:-2}"
# The Python package (python/, docs/PYTHON.md): a venv under target/ with numpy, pytest,
# triton, maturin and the package built from this checkout, then its pytest suite. Idempotent:
# installed requirements are not fetched again (set PIP_FIND_LINKS to a wheel directory to
# install offline).
scripts/test-python.sh
