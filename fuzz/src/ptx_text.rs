//! Fuzz entry for the PTX parser, validator and printer (`ptx` crate).
//!
//! Oracles, beyond "no panic": a module that parses prints to text that parses back to an equal
//! module (`parse(print(m)) == m`), printing is a fixpoint (`print(parse(print(m))) ==
//! print(m)`), and the validator finds the same diagnostics (severity, kind, function) in both.
//! Bytes that are not UTF-8 are decoded lossily (the CLI rejects them before parsing, so this
//! only keeps mutations useful).

/// Runs one input; panics when an oracle is violated.
pub fn check(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    // The builder's raw-PTX escape parses bare statements.
    if let Ok(stmts) = ptx::parse_statements(&text) {
        let _ = stmts.len();
    }
    let m = match ptx::parse(&text) {
        Ok(m) => m,
        Err(e) => {
            // Errors render (they point into the source line).
            let _ = e.to_string();
            return;
        }
    };
    let diags = ptx::validate(&m);
    let printed = ptx::print(&m);
    let m2 = match ptx::parse(&printed) {
        Ok(m2) => m2,
        Err(e) => panic!("print(m) does not parse: {e}\n--- printed ---\n{printed}"),
    };
    assert!(
        m2 == m,
        "parse(print(m)) != m\n--- printed ---\n{printed}\n--- m ---\n{m:?}\n--- m2 ---\n{m2:?}"
    );
    let printed2 = ptx::print(&m2);
    assert!(
        printed2 == printed,
        "print is not a fixpoint\n--- first ---\n{printed}\n--- second ---\n{printed2}"
    );
    let key = |d: &[ptx::Diagnostic]| {
        let mut v: Vec<_> = d
            .iter()
            .map(|d| (d.severity, d.kind, d.function.clone()))
            .collect();
        v.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
        v
    };
    let diags2 = ptx::validate(&m2);
    assert!(
        key(&diags) == key(&diags2),
        "validate differs after a round trip\n--- original ---\n{diags:?}\n--- reprinted ---\n{diags2:?}\n--- printed ---\n{printed}"
    );
}
