//! Every corpus kernel (`tests-data/corpus/<target>/*.json`: Triton- and nvcc-compiled) runs
//! clean under all four emulator sanitizers (`emu::sanitize`): no race, no read of unwritten
//! memory, no barrier or warp-sync misuse, no out-of-bounds access. The outputs still pass
//! their checks (the sanitizers observe, they do not change results).

use runtime::runner::{self, Manifest};
use runtime::Device;
use std::path::{Path, PathBuf};

fn manifests() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests-data/corpus");
    let mut v = Vec::new();
    for t in std::fs::read_dir(&dir).expect("corpus dir").flatten() {
        for f in std::fs::read_dir(t.path()).expect("target dir").flatten() {
            if f.path().extension().is_some_and(|e| e == "json") {
                v.push(f.path());
            }
        }
    }
    v.sort();
    v
}

#[test]
fn corpus_kernels_are_sanitizer_clean() {
    // before any allocation: global initcheck needs the allocations' written-bitmaps
    emu::sanitize::set_process_default(emu::Tools::ALL);
    let dev = Device::emu(0);
    let files = manifests();
    assert!(files.len() >= 20, "{} manifests", files.len());
    let mut failures = Vec::new();
    for p in &files {
        let m: Manifest = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
        let dir = p.parent().unwrap();
        let spec = m.run_spec(dir).unwrap();
        let t0 = std::time::Instant::now();
        match runner::run(&dev, &spec) {
            Ok(out) => {
                println!(
                    "  clean {} ({:.2} s)",
                    p.display(),
                    t0.elapsed().as_secs_f64()
                );
                let st = out.stats.as_ref().expect("emulator stats");
                assert_eq!(st.sanitized, Some(emu::Tools::ALL), "{}", p.display());
                for r in runner::check_outputs(&m, dir, &out, None).unwrap() {
                    if !r.ok() {
                        failures.push(format!("{}: check failed: {r}", p.display()));
                    }
                }
            }
            Err(e) => failures.push(format!("{}: {e}", p.display())),
        }
    }
    println!(
        "{} corpus kernels, {} failures",
        files.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Planted bugs in Triton-compiled kernels: one `bar.sync` deleted from a corpus kernel makes a
/// shared-memory race across the place it stood, reported exactly once by racecheck with one
/// access on each side of it.
#[test]
fn triton_kernels_with_a_barrier_removed_race() {
    emu::sanitize::set_process_default(emu::Tools::ALL);
    let dev = Device::emu(0);
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests-data/corpus/sm_80");
    // (kernel, 1-based line of the bar.sync to delete)
    let cases = [
        ("softmax", 86),
        ("softmax", 99),
        ("cumsum", 111),
        ("cumsum", 131),
        ("layernorm", 99),
        ("layernorm", 114),
        ("reduce_rows", 86),
        ("reduce_rows", 99),
        ("histogram", 132),
    ];
    for (k, line) in cases {
        let m: Manifest =
            serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{k}.json"))).unwrap())
                .unwrap();
        let mut spec = m.run_spec(&dir).unwrap();
        let lines: Vec<&str> = spec.ptx.lines().collect();
        assert!(lines[line - 1].contains("bar.sync"), "{k}:{line}");
        let mutated: Vec<&str> = lines
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != line - 1)
            .map(|(_, l)| *l)
            .collect();
        spec.ptx = mutated.join("\n");
        let e = runner::run(&dev, &spec).expect_err(k);
        let runner::RunError::Runtime(runtime::RuntimeError::Emu(e)) = e else {
            panic!("{k}: {e}")
        };
        let f = e.findings().unwrap_or_else(|| panic!("{k}: {e}"));
        assert_eq!(f.reports.len(), 1, "{k}:{line}: {f}");
        let r = &f.reports[0];
        assert_eq!(r.tool, emu::Tool::Racecheck, "{k}:{line}: {f}");
        let ls: Vec<u32> = r.accesses.iter().map(|a| a.line).collect();
        let (lo, hi) = (*ls.iter().min().unwrap(), *ls.iter().max().unwrap());
        assert!(
            ls.len() == 2 && (lo as usize) < line && hi as usize >= line,
            "{k}:{line}: accesses at lines {ls:?} do not straddle the deleted barrier: {f}"
        );
    }
}
