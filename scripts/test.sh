#!/usr/bin/env bash
# Installs what the tests need (ptxas into .tools/; a Python venv for python/tests) and runs every
# test: the Rust workspace, then the Python package (scripts/test-python.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x scripts/setup-ptxas.sh ]; then
  scripts/setup-ptxas.sh
fi
# Open MPI (crates/netmpi: the MPI engine of ep's proxy transport, multi-process `moe` tests)
# and libclang (the mpi crate's bindgen); idempotent, skipped when already installed
mpi_pkgs="openmpi-bin libopenmpi-dev libclang-dev"
if ! dpkg-query -W -f='${Status}\n' $mpi_pkgs 2>/dev/null | grep -qv "install ok installed" \
  && [ "$(dpkg-query -W -f='${Status}\n' $mpi_pkgs 2>/dev/null | wc -l)" = 3 ]; then
  : # all installed
else
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq $mpi_pkgs >/dev/null
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# the fake CUDA driver (a cdylib, which `cargo test` does not build as such; it is also the fake
# NCCL of crates/netnccl's multi-process tests) and the Hopper
# benchmark example (`--all-targets` builds examples as test harnesses) for the tests that run
# them on the fake driver; they would otherwise build them into a separate target directory
# tests that need ptxas fail (instead of skipping) when it is missing
export PTXFORGE_REQUIRE_PTXAS=1
cargo build -p fakecuda
cargo build -p kernels --example bench_hopper
cargo test --workspace --all-targets -- --test-threads="${TEST_THREADS:-2}"
# the multi-process `ptxforge moe` / `ptxforge comm` (cargo feature `mpi`, not in the default
# build): one process per node under mpirun vs one process, bit for bit
cargo test -p ptxforge-cli --features mpi --test moe_mpi --test comm_mpi -- --test-threads=1
# `ptxforge train` across processes under mpirun (its `ptxforge launch` cases ran above)
cargo test -p ptxforge-cli --features mpi --test train_procs -- --test-threads=1 under_mpirun
# The Python package (python/, docs/PYTHON.md): a venv under target/ with numpy, pytest,
# triton, maturin and the package built from this checkout, then its pytest suite. Idempotent:
# installed requirements are not fetched again (set PIP_FIND_LINKS to a wheel directory to
# install offline).
scripts/test-python.sh
