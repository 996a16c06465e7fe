#!/usr/bin/env bash
# Builds the Python package into a venv (target/.venv-test) and runs its pytest suite
# (python/tests). Called by scripts/test.sh after the Rust tests; runs on its own too.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=target/.venv-test
# Debian's python3 has no venv/ensurepip without python3-venv (CI runs as root)
if ! "$PY" -c 'import ensurepip, venv' 2>/dev/null && command -v apt-get >/dev/null; then
  apt-get install -y -q python3-venv >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null && apt-get install -y -q python3-venv >/dev/null; }
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip -q --disable-pip-version-check "$@"; }
pip install "numpy>=1.21" pytest "maturin>=1.5,<2" "triton==3.9.*" ml_dtypes
# no build isolation: maturin comes from the venv (its bin/ on PATH), not a fresh download on
# every run. The workspace's dev profile (optimised; the emulator at opt-level 3), so the wheel
# reuses what `cargo test` built instead of compiling the whole stack again in release.
PATH="$PWD/$VENV/bin:$PATH" MATURIN_PEP517_ARGS="--profile dev" \
  pip install --no-build-isolation ./python
# Triton is installed above, so its tests must run (not skip)
PTXFORGE_REQUIRE_TRITON=1 "$VENV/bin/python" -m pytest -q python/tests
# The CUDA path (python/tests/test_cuda.py) on the fake driver: the driver API over the emulator
scripts/fakecuda.sh "$VENV/bin/python" -m pytest -q python/tests/test_cuda.py
