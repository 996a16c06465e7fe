//! `ptxforge kernels --check`: registered kernels against their CPU references on a device.
use std::process::Command;

#[test]
fn kernels_check_runs_registered_shapes_and_reports_json() {
    let out = Command::new(env!("CARGO_BIN_EXE_ptxforge"))
        .args(["kernels", "--check", "--filter", "swiglu", "--json"])
        .output()
        .expect("spawn ptxforge");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(v["failed"], 0);
    let checks = v["checks"].as_array().expect("checks");
    assert!(checks.len() >= 2, "{stdout}");
    for c in checks {
        assert_eq!(c["pass"], true, "{c}");
        assert!(c["kernel"].as_str().unwrap_or("").contains("swiglu"));
    }
}

#[test]
fn kernels_check_with_no_match_is_an_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_ptxforge"))
        .args(["kernels", "--check", "--filter", "no_such_kernel"])
        .output()
        .expect("spawn ptxforge");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no kernel matched"));
}
