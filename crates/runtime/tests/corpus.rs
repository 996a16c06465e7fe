//! Runs every Triton corpus manifest (`tests-data/corpus/<target>/<kernel>.json`) on the
//! emulator through `runtime::runner` and applies its checks (docs/TOOLS.md).
//!
//! Each case runs twice: with zero-initialised outputs (what the manifests assume), and with
//! outputs pre-filled with a poison byte, which must give the same verdict — so an output the
//! kernel should write but the emulator leaves alone cannot pass by being zero. Exceptions are
//! listed below with their reasons. One line per case is printed; the test fails listing every
//! failing case.
//!
//! Numerics: the default (each kernel target's tensor-core model); the manifests' tolerances
//! (GEMMs: rtol 1e-2 against the GPU-free reference) hold under it as under exact sums.

use runtime::runner::{self, Manifest, OutInit};
use runtime::Device;
use std::path::{Path, PathBuf};

const POISON: u8 = 0xff;

/// Cases the emulator cannot run yet: they must fail with its "unsupported" error.
/// (target, kernel, reason)
const UNSUPPORTED: &[(&str, &str, &str)] = &[];

/// Kernels whose outputs depend on their initial contents: the poisoned run does not apply.
const ACCUMULATES: &[(&str, &str)] = &[(
    "histogram",
    "atom.global.add accumulates into the zero-initialised outputs",
)];

/// Kernels that leave part of a checked output unwritten (where 0 is expected): in the poisoned
/// run those elements must still hold the poison pattern.
const PARTIAL_WRITES: &[(&str, &str)] =
    &[("add", "masked tail: n=4000 of 4096 elements are written")];

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests-data/corpus")
}

fn manifests() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Ok(targets) = std::fs::read_dir(corpus_dir()) {
        for t in targets.flatten() {
            if let Ok(files) = std::fs::read_dir(t.path()) {
                v.extend(
                    files
                        .flatten()
                        .map(|f| f.path())
                        .filter(|p| p.extension().is_some_and(|e| e == "json")),
                );
            }
        }
    }
    v.sort();
    v
}

enum Verdict {
    Pass(String),
    Skip(String),
    Fail(String),
}

fn run_case(dev: &Device, path: &Path, target: &str, kernel: &str) -> Verdict {
    let dir = path.parent().unwrap_or(Path::new("."));
    let m: Manifest = match std::fs::read_to_string(path)
        .map_err(|e| e.to_string())
        .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
    {
        Ok(m) => m,
        Err(e) => return Verdict::Fail(format!("manifest: {e}")),
    };
    let mut spec = match m.run_spec(dir) {
        Ok(s) => s,
        Err(e) => return Verdict::Fail(e.to_string()),
    };
    let unsupported = UNSUPPORTED
        .iter()
        .find(|(t, k, _)| *t == target && *k == kernel);
    let zero = runner::run(dev, &spec);
    let zero = match (zero, unsupported) {
        (
            Err(runner::RunError::Runtime(runtime::RuntimeError::Emu(
                emu::EmuError::Unsupported { text, .. },
            ))),
            Some((_, _, why)),
        ) => {
            return Verdict::Skip(format!("{why} (emulator: unsupported `{text}`)"));
        }
        (Err(e), _) => return Verdict::Fail(format!("zero-initialised run: {e}")),
        (Ok(o), _) => o,
    };
    let mut notes = Vec::new();
    if let Some((_, _, why)) = unsupported {
        notes.push(format!("listed as unsupported ({why}) but now runs"));
    }
    match runner::check_outputs(&m, dir, &zero, None) {
        Ok(rs) => {
            let bad: Vec<String> = rs
                .iter()
                .filter(|r| !r.ok())
                .map(|r| r.to_string())
                .collect();
            if !bad.is_empty() {
                return Verdict::Fail(format!("zero-initialised run: {}", bad.join("; ")));
            }
        }
        Err(e) => return Verdict::Fail(format!("zero-initialised run: {e}")),
    }
    let secs = zero.seconds;
    if let Some((_, why)) = ACCUMULATES.iter().find(|(k, _)| *k == kernel) {
        notes.push(format!("no poisoned run: {why}"));
    } else {
        let partial = PARTIAL_WRITES.iter().any(|(k, _)| *k == kernel);
        spec.out_init = OutInit::Poison(POISON);
        let out = match runner::run(dev, &spec) {
            Ok(o) => o,
            Err(e) => return Verdict::Fail(format!("poisoned run: {e}")),
        };
        match runner::check_outputs(&m, dir, &out, partial.then_some(POISON)) {
            Ok(rs) => {
                let bad: Vec<String> = rs
                    .iter()
                    .filter(|r| !r.ok())
                    .map(|r| r.to_string())
                    .collect();
                if !bad.is_empty() {
                    return Verdict::Fail(format!(
                        "poisoned run (outputs pre-filled with {POISON:#04x}): {}",
                        bad.join("; ")
                    ));
                }
                let untouched: usize = rs.iter().map(|r| r.untouched).sum();
                if partial {
                    notes.push(format!("{untouched} elements left unwritten (expected 0)"));
                }
            }
            Err(e) => return Verdict::Fail(format!("poisoned run: {e}")),
        }
    }
    Verdict::Pass(format!(
        "{:.2} s{}{}",
        secs,
        if notes.is_empty() { "" } else { "; " },
        notes.join("; ")
    ))
}

#[test]
fn corpus_on_emulator() {
    let files = manifests();
    assert!(
        !files.is_empty(),
        "no manifests under {}",
        corpus_dir().display()
    );
    let dev = Device::emu(0);
    let (mut pass, mut skip) = (0, 0);
    let mut failures = Vec::new();
    for p in &files {
        let kernel = p
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("?")
            .to_string();
        let target = p
            .parent()
            .and_then(|d| d.file_name())
            .and_then(|s| s.to_str())
            .unwrap_or("?")
            .to_string();
        let name = format!("{target}/{kernel}");
        match run_case(&dev, p, &target, &kernel) {
            Verdict::Pass(n) => {
                pass += 1;
                println!("  pass {name:<26} {n}");
            }
            Verdict::Skip(why) => {
                skip += 1;
                println!("  skip {name:<26} {why}");
            }
            Verdict::Fail(why) => {
                println!("  FAIL {name:<26} {why}");
                failures.push(format!("{name}: {why}"));
            }
        }
    }
    println!(
        "corpus: {pass} passed, {} failed, {skip} skipped",
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} corpus case(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The checks must catch a wrong element, and the poisoned run must catch an output left alone.
#[test]
fn checks_catch_corruption() {
    let path = corpus_dir().join("sm_80/add.json");
    let dir = path.parent().unwrap();
    let m: Manifest = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let spec = m.run_spec(dir).unwrap();
    let mut out = runner::run(&Device::emu(0), &spec).unwrap();
    assert!(runner::check_outputs(&m, dir, &out, None)
        .unwrap()
        .iter()
        .all(|r| r.ok()));
    let buf = out.buffers[2].as_mut().unwrap();
    // One wrong element (relative error 1e-5 > rtol 1e-6).
    let v = f32::from_le_bytes(buf.data[40..44].try_into().unwrap()) * (1.0 + 1e-5);
    buf.data[40..44].copy_from_slice(&v.to_le_bytes());
    let r = runner::check_outputs(&m, dir, &out, None).unwrap();
    assert_eq!(r[0].mismatches, 1, "{}", r[0]);
    assert_eq!(r[0].first.map(|f| f.0), Some(10));
    // A written element left at the poison pattern fails even when poison is tolerated.
    let buf = out.buffers[2].as_mut().unwrap();
    buf.data[0..4].fill(POISON);
    let r = runner::check_outputs(&m, dir, &out, Some(POISON)).unwrap();
    assert_eq!(r[0].mismatches, 2, "{}", r[0]);
}
