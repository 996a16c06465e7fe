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
                println!("  clean {} ({:.2} s)", p.display(), t0.elapsed().as_secs_f64());
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
    println!("{} corpus kernels, {} failures", files.len(), failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
