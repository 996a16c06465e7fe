//! Every Triton-generated `.ptx` under `tests-data/corpus/<target>/` parses, prints, re-parses
//! equal with the same instruction count, validates without errors and — when `ptxas` is
//! installed — assembles for its target after printing.

use ptx::validate::{validate, Severity};
use std::path::{Path, PathBuf};

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests-data/corpus")
}

/// `(target, path)` for every corpus file, sorted.
fn corpus_files() -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    let mut stack = vec![corpus_dir()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "ptx") {
                let target = p
                    .parent()
                    .and_then(|x| x.file_name())
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.push((target, p));
            }
        }
    }
    out.sort();
    out
}

fn count_instructions(m: &ptx::Module) -> usize {
    m.functions().map(|f| f.instructions().len()).sum()
}

#[test]
fn corpus_round_trips_and_validates() {
    let files = corpus_files();
    assert!(
        files.len() >= 20,
        "corpus not found under {}",
        corpus_dir().display()
    );
    let mut failures = Vec::new();
    for (_, path) in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let m = match ptx::parse(&text) {
            Ok(m) => m,
            Err(e) => {
                failures.push(format!("{}: parse: {e}", path.display()));
                continue;
            }
        };
        let printed = ptx::print(&m);
        let m2 = match ptx::parse(&printed) {
            Ok(m2) => m2,
            Err(e) => {
                failures.push(format!("{}: re-parse of printed text: {e}", path.display()));
                continue;
            }
        };
        if m != m2 {
            failures.push(format!("{}: re-parsed module differs", path.display()));
        }
        let n = count_instructions(&m);
        if n == 0 || n != count_instructions(&m2) {
            failures.push(format!(
                "{}: instruction count {n} vs {}",
                path.display(),
                count_instructions(&m2)
            ));
        }
        for d in validate(&m) {
            if d.severity == Severity::Error {
                failures.push(format!("{}: {d}", path.display()));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} corpus failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn corpus_printed_text_assembles() {
    let Some(_) = ptx::ptxas::ptxas_for_tests("corpus assembly") else {
        return;
    };
    let files = corpus_files();
    // Assemble in a few threads: each ptxas run is a separate process.
    let chunks: Vec<Vec<(String, PathBuf)>> = {
        let n = 4;
        let mut c = vec![Vec::new(); n];
        for (i, f) in files.into_iter().enumerate() {
            c[i % n].push(f);
        }
        c
    };
    let failures: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = chunks
            .iter()
            .map(|chunk| {
                s.spawn(move || {
                    let mut fails = Vec::new();
                    for (target, path) in chunk {
                        let text = std::fs::read_to_string(path).unwrap();
                        let m = ptx::parse(&text).unwrap();
                        let printed = ptx::print(&m);
                        let opts = ptx::ptxas::PtxasOptions {
                            opt_level: Some(0),
                            ..Default::default()
                        };
                        if let Err(e) = ptx::ptxas::assemble(&printed, target, &opts) {
                            fails.push(format!("{} ({target}): {e}", path.display()));
                        }
                    }
                    fails
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
