#!/usr/bin/env bash
# Installs what the tests need (ptxas into .tools/) and runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x scripts/setup-ptxas.sh ]; then
  scripts/setup-ptxas.sh
fi
cargo test --workspace --all-targets -- --test-threads="${TEST_THREADS:-2}"
