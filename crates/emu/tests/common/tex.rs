//! The harness the texture tests share: check and load a kernel, launch it, and make, poison
//! and read back global buffers.

use emu::{launch, Allocation, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};
use std::sync::Arc;

#[path = "load.rs"]
mod load;
pub use load::load_checked;

/// Launches kernel `k` over `threads` threads with u64 parameters.
pub fn run(
    m: &LoadedModule,
    mem: &GlobalMemory,
    threads: usize,
    params: &[u64],
) -> Result<(), String> {
    let p: Vec<u8> = params.iter().flat_map(|x| x.to_le_bytes()).collect();
    let cfg = LaunchConfig::linear(threads.div_ceil(128) as u32, 128);
    launch(
        m.kernel("k").unwrap(),
        mem.snapshot(),
        p,
        &cfg,
        &LaunchOptions::default(),
    )
    .map(|_| ())
    .map_err(|e| e.to_string())
}

/// A global buffer holding `bytes`.
pub fn buffer(mem: &GlobalMemory, bytes: &[u8]) -> Arc<Allocation> {
    let a = mem.alloc(bytes.len().max(1) as u64, 0).unwrap();
    a.write_bytes(0, bytes);
    a
}

/// A global buffer of `len` bytes of 0xa5.
pub fn poisoned(mem: &GlobalMemory, len: usize) -> Arc<Allocation> {
    let a = mem.alloc(len as u64, 0).unwrap();
    a.fill(0, len as u64, &[0xa5]);
    a
}

/// The first `len` bytes of `a`.
pub fn read(a: &Allocation, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    a.read_bytes(0, &mut v);
    v
}

/// The validator's errors for `text` (which must parse).
pub fn validator_errors(text: &str) -> Vec<String> {
    let m = ptx::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    ptx::validate(&m)
        .into_iter()
        .filter(|d| d.is_error())
        .map(|d| d.to_string())
        .collect()
}
