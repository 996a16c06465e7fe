//! `ptxforge moe` end to end on a small configuration (2 nodes x 2 emulated devices): forward
//! and backward, every check against the f64 reference must pass and the JSON says so.

use std::process::Command;

#[test]
fn moe_small_config_passes_all_checks() {
    let dir = std::env::temp_dir().join(format!("ptxforge-moe-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let trace = dir.join("trace.json");
    let out = Command::new(env!("CARGO_BIN_EXE_ptxforge"))
        .args([
            "moe",
            "--nodes",
            "2",
            "--gpus-per-node",
            "2",
            "--hidden",
            "256",
            "--experts",
            "16",
            "--intermediate",
            "128",
            "--tokens",
            "64",
            "--topk",
            "4",
            "--groups",
            "4",
            "--topk-groups",
            "2",
            "--num-sms",
            "4",
            "--check-tokens",
            "0",
            "--check-experts",
            "4",
            "--json",
            "--trace",
        ])
        .arg(&trace)
        .output()
        .expect("spawn ptxforge");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("JSON report");
    assert_eq!(v["ok"], serde_json::Value::Bool(true), "{stdout}");
    for p in v["phases"].as_array().expect("phases") {
        if let Some(ok) = p.get("ok") {
            assert_eq!(ok, &serde_json::Value::Bool(true), "phase {p}");
        }
    }
    assert_eq!(v["sampled_tokens_per_rank"], 64);
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).expect("trace written"))
            .expect("trace JSON");
    assert!(!t["traceEvents"].as_array().expect("events").is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}
