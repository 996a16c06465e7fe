//! Snapshot of the PTX the Hopper GEMM generator emits: one FNV-1a 64-bit hash of the printed
//! module per configuration, compared against `tests/hopper_ptx_snapshot.txt`.
//!
//! It guards refactors of `kernels::hopper::gemm` that must not change the emitted code (the
//! emulator and ptxas tests check behaviour on a few shapes; this checks every configuration the
//! registry, the tests, the benchmarks and `choose_spec` can pick, byte for byte). The list
//! covers FP8 / BF16, the normal / contiguous / masked layouts, 1 or 2 math warpgroups, TMA
//! multicast, block N at every multiple of 16 and several odd multiples of 8, and the stage counts
//! the tests set. Invalid combinations are recorded as `invalid` (their error must persist).
//!
//! When the generated code changes on purpose, regenerate the snapshot and review the diff:
//!
//! ```text
//! PTXFORGE_BLESS=1 cargo test -p kernels --test hopper_ptx_snapshot
//! ```

use kernels::gemm::{InTy, Layout};
use kernels::hopper::{self, HopperSpec};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// FNV-1a, 64 bits (no dependency; a change in any byte changes the hash).
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Every configuration the snapshot covers (a key that names all the spec's fields is its line).
fn specs() -> Vec<HopperSpec> {
    let mut v = Vec::new();
    let mut bns: Vec<u32> = (1..=16).map(|i| 16 * i).collect();
    bns.extend([8, 24, 40, 56, 72, 88, 104, 120, 136, 200]);
    for input in [InTy::Fp8, InTy::Bf16] {
        for layout in [Layout::Normal, Layout::Contiguous, Layout::Masked] {
            for &bn in &bns {
                for wgs in [1, 2] {
                    let s = HopperSpec::new(input, layout, bn).with_math_wgs(wgs);
                    v.push(s);
                    if wgs == 2 && (bn % 32 == 0 || bn == 112) {
                        v.push(s.with_multicast(true));
                    }
                }
            }
            for stages in [2, 3, 4] {
                v.push(HopperSpec::new(input, layout, 128).with_stages(stages));
            }
        }
    }
    // stage counts the emulator tests and benchmarks set
    v.push(HopperSpec::new(InTy::Fp8, Layout::Normal, 96).with_stages(2));
    v.push(HopperSpec::new(InTy::Fp8, Layout::Normal, 144).with_stages(4));
    v.push(
        HopperSpec::new(InTy::Fp8, Layout::Normal, 128)
            .with_stages(3)
            .with_multicast(true),
    );
    v.push(
        HopperSpec::new(InTy::Fp8, Layout::Normal, 128)
            .with_math_wgs(1)
            .with_stages(2),
    );
    v.push(HopperSpec::new(InTy::Bf16, Layout::Normal, 80).with_stages(2));
    v.push(HopperSpec::new(InTy::Bf16, Layout::Normal, 40).with_stages(2));
    // every registered Hopper kernel
    for info in kernels::registry::registry() {
        if let kernels::registry::Kind::Hopper(s) = &info.kind {
            v.push(*s);
        }
    }
    v
}

/// The snapshot line key of a spec: its kernel name plus the fields the name leaves out.
fn key(s: &HopperSpec) -> String {
    format!(
        "{}_wgs{}_regs{}-{}",
        s.name(),
        s.math_wgs,
        s.producer_regs,
        s.consumer_regs
    )
}

fn snapshot_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/hopper_ptx_snapshot.txt")
}

fn current() -> BTreeMap<String, String> {
    let t = builder::Target::sm90a();
    let mut out = BTreeMap::new();
    for s in specs() {
        let value = match hopper::gen_hopper_gemm(&t, &s) {
            Ok(m) => format!("{:016x}", fnv1a64(ptx::print(&m).as_bytes())),
            Err(_) => "invalid".to_string(),
        };
        out.insert(key(&s), value);
    }
    out
}

#[test]
fn hopper_ptx_matches_snapshot() {
    let got = current();
    let path = snapshot_path();
    if std::env::var_os("PTXFORGE_BLESS").is_some() {
        let text: String = got.iter().map(|(k, v)| format!("{k} {v}\n")).collect();
        std::fs::write(&path, text).unwrap();
        eprintln!("wrote {} configurations to {}", got.len(), path.display());
        return;
    }
    let text = std::fs::read_to_string(&path).unwrap();
    let want: BTreeMap<String, String> = text
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let valid = want.values().filter(|v| *v != "invalid").count();
    assert!(
        valid >= 100,
        "snapshot holds only {valid} valid configurations"
    );
    let mut diffs = Vec::new();
    for (k, v) in &got {
        match want.get(k) {
            Some(w) if w == v => {}
            Some(w) => diffs.push(format!("{k}: snapshot {w}, generated {v}")),
            None => diffs.push(format!("{k}: not in the snapshot (generated {v})")),
        }
    }
    for k in want.keys().filter(|k| !got.contains_key(*k)) {
        diffs.push(format!("{k}: in the snapshot, no longer generated"));
    }
    assert!(
        diffs.is_empty(),
        "{} of {} configurations differ from {} (regenerate with PTXFORGE_BLESS=1 only if \
         the change is intended):\n{}",
        diffs.len(),
        got.len(),
        path.display(),
        diffs.join("\n")
    );
}
