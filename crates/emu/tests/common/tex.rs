//! The harness the texture tests share: check and load a kernel, launch it, and make, poison
//! and read back global buffers.

use emu::{launch, Allocation, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule};
use std::sync::Arc;

/// Checks `text` (validator, printer round trip, and ptxas for each of `archs` when installed;
/// `label` names the test in ptxas's skip message) and loads it.
pub fn load_checked(mem: &GlobalMemory, text: &str, archs: &[&str], label: &str) -> LoadedModule {
    let module = ptx::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let errors: Vec<_> = ptx::validate(&module)
        .into_iter()
        .filter(|d| d.is_error())
        .collect();
    assert!(errors.is_empty(), "validator: {errors:?}\n{text}");
    assert_eq!(ptx::parse(&ptx::print(&module)).unwrap(), module);
    if ptx::ptxas::ptxas_for_tests(label).is_some() {
        for arch in archs {
            let t = text.replace("sm_90a", arch);
            ptx::ptxas::assemble(&t, arch, &Default::default())
                .unwrap_or_else(|e| panic!("ptxas ({arch}) rejects the test PTX: {e}\n{t}"));
        }
    }
    LoadedModule::load(mem, module, 0).unwrap()
}

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
