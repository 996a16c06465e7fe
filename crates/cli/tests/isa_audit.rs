//! `ptxforge check` passes every ISA-audit file (`tests-data/isa_audit/`, one kernel per form
//! ptxas 13.5 accepts for sm_70..sm_90a): parse, validate, no emulator warnings and, when ptxas
//! is installed, ptxas (PTX for sm_70 is assembled for sm_75, which this ptxas has, with a
//! warning saying so).

use std::process::Command;

#[test]
fn check_passes_every_audited_form() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests-data/isa_audit");
    for target in ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_90a"] {
        let file = dir.join(format!("{target}.ptx"));
        let out = Command::new(env!("CARGO_BIN_EXE_ptxforge"))
            .args(["check", "--json"])
            .arg(&file)
            .output()
            .expect("spawn ptxforge");
        let text = String::from_utf8_lossy(&out.stdout);
        let j: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{target}: {e}: {text}"));
        assert_eq!(j["ok"], true, "{target}: {j:#}");
        let diags = j["diagnostics"].as_array().cloned().unwrap_or_default();
        let emu: Vec<_> = diags.iter().filter(|d| d["source"] == "emulator").collect();
        assert!(
            emu.is_empty(),
            "{target}: the emulator cannot run: {emu:#?}"
        );
        if target == "sm_70" && j["ptxas"] == "ok" {
            assert!(
                diags
                    .iter()
                    .any(|d| d["message"].as_str().is_some_and(|m| m.contains("sm_75"))),
                "{j:#}"
            );
        }
    }
}
