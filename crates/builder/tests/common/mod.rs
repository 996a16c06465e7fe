//! Shared checks: print -> parse back equal -> validate -> ptxas (0 spills).
#![allow(dead_code)]

use ptx::Module;

/// Prints, parses back (must be equal), validates and assembles `m` for `arch`.
pub fn check(m: &Module, arch: &str) {
    let text = ptx::print(m);
    let back =
        ptx::parse(&text).unwrap_or_else(|e| panic!("printed PTX does not parse: {e}\n{text}"));
    assert_eq!(&back, m, "parse(print(m)) != m\n{text}");
    let errs = ptx::validate::validate_errors(m);
    assert!(
        errs.is_empty(),
        "validator errors:\n{}\n{text}",
        errs.iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
    assemble(&text, arch);
}

/// Assembles with ptxas when available; asserts success and 0 spills.
pub fn assemble(text: &str, arch: &str) {
    if ptx::ptxas::ptxas_for_tests(&format!("assembly for {arch}")).is_none() {
        return;
    }
    match ptx::ptxas::assemble(text, arch, &Default::default()) {
        Ok(r) => {
            for k in &r.kernels {
                assert_eq!(
                    k.spill_stores_bytes + k.spill_loads_bytes,
                    0,
                    "{} spills on {arch}",
                    k.name
                );
            }
        }
        Err(e) => {
            let numbered: String = text
                .lines()
                .enumerate()
                .map(|(i, l)| format!("{:4} {l}\n", i + 1))
                .collect();
            panic!("ptxas {arch} failed: {e}\n{numbered}");
        }
    }
}
