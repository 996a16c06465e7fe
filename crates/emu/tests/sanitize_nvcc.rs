//! The sanitizers on planted bugs in nvcc-compiled kernels (`tests-data/sanitize/nvcc`: the CUDA
//! source, the PTX nvcc 13.5 made of it, and `build.sh`): each buggy kernel is reported exactly
//! once, by the right tool, at the PTX lines of the faulty accesses; the same kernels built with
//! the bug fixed (`-DFIXED`) report nothing.

use emu::{launch, EmuError, GlobalMemory, LaunchConfig, LaunchOptions, LoadedModule, Tool, Tools};
use std::collections::BTreeSet;

fn ptx(name: &str) -> String {
    let p = format!(
        "{}/../../tests-data/sanitize/nvcc/{name}.ptx",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

/// Launches `entry` (grid 2, block 128) on fresh random buffers `out`, `in` (1024 floats each,
/// both written by the host) with n = 256, all sanitizers on.
fn run(text: &str, entry: &str) -> Result<(), EmuError> {
    let mem = GlobalMemory::new();
    mem.set_track_writes(true);
    let m = LoadedModule::load(&mem, ptx::parse(text).expect("parse"), 0).expect("load");
    let mut params = Vec::new();
    for _ in 0..2 {
        let b = mem.alloc(4096, 0).unwrap();
        let data: Vec<u8> = (0..1024)
            .flat_map(|_| (rand::random::<f32>() + 0.5).to_le_bytes())
            .collect();
        b.write_bytes(0, &data);
        params.extend_from_slice(&b.base.to_le_bytes());
    }
    params.extend_from_slice(&256i32.to_le_bytes());
    let mut cfg = LaunchConfig::linear(2, 128);
    cfg.sms = 2;
    let opts = LaunchOptions {
        sanitize: Tools::ALL,
        threads: 2,
        ..LaunchOptions::default()
    };
    launch(
        m.kernel(entry).unwrap(),
        mem.snapshot(),
        params,
        &cfg,
        &opts,
    )
    .map(|_| ())
}

/// The 1-based lines of `entry`'s body that contain any of `needles`.
fn lines_of(text: &str, entry: &str, needles: &[&str]) -> BTreeSet<u32> {
    let start = text
        .lines()
        .position(|l| l.contains(&format!(".entry {entry}(")))
        .unwrap_or_else(|| panic!("no entry {entry}"));
    let mut out = BTreeSet::new();
    for (i, l) in text.lines().enumerate().skip(start) {
        if i > start && l.contains(".entry ") {
            break;
        }
        if needles.iter().any(|n| l.contains(n)) {
            out.insert(i as u32 + 1);
        }
    }
    assert!(!out.is_empty(), "{entry}: none of {needles:?} found");
    out
}

/// (entry, tool, instruction text that marks each faulty access, whether every marked line
/// must be named or at least one of them).
const CASES: [(&str, Tool, &[&str], bool); 6] = [
    (
        "race_smem",
        Tool::Racecheck,
        &["st.volatile.shared.f32", "ld.volatile.shared.f32"],
        true,
    ),
    ("uninit_smem", Tool::Initcheck, &["+512]"], true),
    ("divergent_barrier", Tool::Synccheck, &["bar.sync"], true),
    // both CTAs' thread 0 load and store out[0]: the race is named by any two of those accesses
    (
        "rmw_between_ctas",
        Tool::Racecheck,
        &["ld.global.f32 \t%f1, [%rd3]", "st.global"],
        false,
    ),
    ("out_of_bounds", Tool::Memcheck, &["st.global"], true),
    ("shfl_mask", Tool::Synccheck, &["shfl.sync"], true),
];

#[test]
fn nvcc_planted_bugs_are_reported_once_by_the_right_tool() {
    let text = ptx("planted");
    for (entry, tool, needles, all) in CASES {
        let e = run(&text, entry).expect_err(entry);
        let f = e
            .findings()
            .unwrap_or_else(|| panic!("{entry}: not a sanitizer report: {e}"));
        assert_eq!(f.reports.len(), 1, "{entry}: {f}");
        let rep = &f.reports[0];
        assert_eq!(rep.tool, tool, "{entry}: {f}");
        let want = lines_of(&text, entry, needles);
        let got: BTreeSet<u32> = rep.accesses.iter().map(|a| a.line).collect();
        if all {
            assert_eq!(got, want, "{entry}: {f}");
        } else {
            assert!(!got.is_empty() && got.is_subset(&want), "{entry}: {f}");
        }
    }
}

#[test]
fn nvcc_fixed_kernels_report_nothing() {
    let text = ptx("fixed");
    for (entry, ..) in CASES {
        if let Err(e) = run(&text, entry) {
            panic!("{entry}: false report on the fixed kernel: {e}");
        }
    }
}
