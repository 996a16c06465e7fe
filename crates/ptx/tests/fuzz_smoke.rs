//! The `ptx_text` fuzz target's entry function (`fuzz/src/ptx_text.rs`: parse, validate, print,
//! `parse(print(m)) == m`) over its seed corpus — every PTX file of the repository — so CI
//! exercises the target on stable, and over the inputs the fuzzer found
//! (`tests/fuzz/ptx_text/`), each with a named test here. The fuzzer itself: docs/RELIABILITY.md ("Fuzzing").

#[path = "../../../fuzz/src/ptx_text.rs"]
mod ptx_text;

#[path = "../../../fuzz/src/repo_files.rs"]
mod repo_files;

use repo_files::{files, root};

#[test]
fn seed_corpus_passes_the_oracles() {
    let r = root();
    let mut seeds = files(&r.join("tests-data/corpus"), ".ptx");
    seeds.extend(files(&r.join("examples/ptx"), ".ptx"));
    assert!(seeds.len() >= 29, "{} seeds", seeds.len());
    for p in &seeds {
        let data = std::fs::read(p).unwrap();
        // Real kernels must parse, or the round-trip oracles would not run on them.
        let text = String::from_utf8(data.clone()).unwrap();
        if let Err(e) = ptx::parse(&text) {
            panic!("{}: {e}", p.display());
        }
        ptx_text::check(&data);
        // A truncated file is the most common broken input.
        ptx_text::check(&data[..data.len() / 2]);
    }
}

#[test]
fn fuzzer_findings_pass_the_oracles() {
    let found = files(&root().join("crates/ptx/tests/fuzz/ptx_text"), "");
    assert!(!found.is_empty());
    for p in &found {
        ptx_text::check(&std::fs::read(p).unwrap());
    }
}

/// Found by the `ptx_text` fuzzer (tests/fuzz/ptx_text/version-overflow): `.version` with a
/// major number near `u32::MAX` overflowed `major * 10 + minor` (a panic with overflow
/// checks, a wrapped version without).
#[test]
fn version_overflowing_u32_is_a_parse_error() {
    for v in ["429496730.0", "4294967295.8", "99999999999.1"] {
        let text = format!(".version {v}\n.target sm_80\n.address_size 64\n");
        let e = ptx::parse(&text).unwrap_err();
        assert_eq!(e.line, 1, "{v}: {e}");
    }
    assert_eq!(
        ptx::parse(".version 8.4\n.target sm_90a\n")
            .unwrap()
            .version,
        84
    );
}
