//! The repository's files that seed the fuzz targets, found the same way by both targets' CI
//! smoke tests (`crates/{ptx,runtime}/tests/fuzz_smoke.rs` include this file with `#[path]`).

use std::path::{Path, PathBuf};

/// The repository's root, from a workspace crate's manifest directory.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Files under `dir` (recursively) whose name ends with `ext` (any file when `ext` is empty),
/// sorted.
pub fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.to_string_lossy().ends_with(ext) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}
