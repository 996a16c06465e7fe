//! `ptxforge bench attn` on the emulator: the three stages run (small sizes) and report their
//! kernels and emulated lane-instruction counts.
use std::process::Command;

#[test]
fn bench_attn_reports_every_stage_on_the_emulator() {
    let out = Command::new(env!("CARGO_BIN_EXE_ptxforge"))
        .args([
            "bench",
            "attn",
            "--seqlen",
            "70",
            "--decode-len",
            "100",
            "--reps",
            "1",
            "--json",
        ])
        .output()
        .expect("spawn ptxforge");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    let rows = v.as_array().expect("rows");
    let stages: Vec<&str> = rows.iter().filter_map(|r| r["stage"].as_str()).collect();
    assert_eq!(stages, ["train fwd", "train bwd", "decode"]);
    let launches: Vec<usize> = rows
        .iter()
        .map(|r| r["kernels"].as_array().map_or(0, |k| k.len()))
        .collect();
    assert_eq!(launches, [1, 3, 2], "{stdout}");
    for r in rows {
        assert!(r["lane_instructions"].as_u64().unwrap_or(0) > 0, "{r}");
        assert!(r["flops"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
    }
}
