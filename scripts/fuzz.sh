#!/usr/bin/env bash
# Runs one fuzz target (fuzz/: cargo-fuzz + libFuzzer, nightly) as one process.
#   scripts/fuzz.sh TARGET [RUNS] [extra libFuzzer flags...]
# TARGET: ptx_text (parser, validator, printer) or run_args (`ptxforge run`'s argument and
# `.npy` handling). RUNS: inputs to execute (default 1000000). The corpus directory
# fuzz/corpus/TARGET is seeded from the repository (every PTX file, or the argument seeds and
# every `.npy` file) plus the regression inputs under crates/*/tests/fuzz/TARGET; it keeps
# what libFuzzer adds between runs. Crashes land in fuzz/artifacts/TARGET. See
# docs/RELIABILITY.md ("Fuzzing").
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:?usage: scripts/fuzz.sh ptx_text|run_args [RUNS] [libFuzzer flags]}
runs=${2:-1000000}
shift $(( $# >= 2 ? 2 : 1 ))
corpus=fuzz/corpus/$target
mkdir -p "$corpus"
name() { echo "seed-$(echo "$1" | tr '/' '_')"; }
case $target in
ptx_text)
    for f in $(git ls-files '*.ptx'); do cp "$f" "$corpus/$(name "$f")"; done
    cp crates/ptx/tests/fuzz/ptx_text/* "$corpus/" 2>/dev/null || true
    extra=(-dict="$PWD/fuzz/ptx.dict" -max_len=16384)
    ;;
run_args)
    cp fuzz/seeds/run_args/* "$corpus/"
    # mode byte 1: the rest of the input is a .npy file
    for f in $(git ls-files '*.npy'); do { printf '\001'; cat "$f"; } >"$corpus/$(name "$f")"; done
    cp crates/runtime/tests/fuzz/run_args/* "$corpus/" 2>/dev/null || true
    extra=(-max_len=4096)
    ;;
*) echo "unknown target $target" >&2; exit 2 ;;
esac
cd fuzz
# -s none: the code under test is safe Rust (no sanitizer needed, ~2x faster);
# -a: debug assertions, so integer overflow panics as in `cargo test`.
exec cargo +nightly fuzz run -s none -a "$target" "$PWD/corpus/$target" -- \
    -runs="$runs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "${extra[@]}" "$@"
