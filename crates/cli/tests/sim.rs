//! `ptxforge sim` end to end: serving preset and TOML files, the decode sweep pictures,
//! calibration from synthetic benchmark files into a profile that `--hardware` uses, the
//! published-table reproduction, and one-line errors naming the field.

mod common;

use std::process::{Command, Output};

fn ptxforge(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ptxforge"))
        .args(args)
        .output()
        .expect("spawn ptxforge")
}

fn ok_json(args: &[&str]) -> serde_json::Value {
    let out = ptxforge(args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{args:?}: exit {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).expect("JSON output")
}

fn fails_with(args: &[&str], needle: &str) {
    let out = ptxforge(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{args:?} should fail");
    assert!(err.contains(needle), "{args:?}: `{err}` lacks `{needle}`");
    assert_eq!(err.trim().lines().count(), 1, "one-line error: {err}");
}

fn dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("ptxforge-sim-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

#[test]
fn serving_preset_and_toml_file_agree_and_match_published() {
    let v = ok_json(&["sim", "v3-serve", "--json"]);
    for row in v["published"].as_array().unwrap() {
        let e = row["error"].as_f64().unwrap();
        assert!(e.abs() <= 0.2, "{row}");
    }
    let toml = ptxforge(&["sim", "v3-serve", "--print-config"]);
    assert!(toml.status.success());
    let path = dir().join("serve.toml");
    std::fs::write(&path, &toml.stdout).unwrap();
    let p = path.to_str().unwrap();
    let w = ok_json(&["sim", p, "--json"]);
    assert_eq!(v["report"], w["report"]);
    // A bad value in the file: one line naming the field.
    let text = String::from_utf8_lossy(&toml.stdout).replace("nodes = 18", "nodes = 0");
    let bad = dir().join("bad-serve.toml");
    std::fs::write(&bad, text).unwrap();
    fails_with(&["sim", bad.to_str().unwrap()], "decode.nodes");
    fails_with(&["sim", "v3-serve", "--trace", "t.json"], "training");
    fails_with(&["sim", "v3-serve", "--sweep", "batch=0..3"], "LO");
    fails_with(
        &["sim", "v3-serve", "--sweep", "comm-sms=1..3"],
        "batch=LO..HI",
    );
}

#[test]
fn serving_sweep_writes_pictures() {
    let d = dir();
    let (svg, png) = (d.join("serve.svg"), d.join("serve.png"));
    let v = ok_json(&[
        "sim",
        "v3-serve",
        "--sweep",
        "batch=1..40",
        "--svg",
        svg.to_str().unwrap(),
        "--png",
        png.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(v["sweep"]["points"].as_array().unwrap().len(), 40);
    assert!(std::fs::read_to_string(&svg)
        .unwrap()
        .contains("DeepSeek published"));
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn calibrate_then_simulate_with_the_profile() {
    use sim::compute::{Gemm, GemmCal};
    let mut hw = sim::config::h800();
    hw.tflops_fp8 = 1000.0; // a slower machine
    let cal = GemmCal::h800();
    let rows: Vec<serde_json::Value> = [
        (4096usize, 4096usize, 4096usize),
        (64, 7168, 2048),
        (8192, 2048, 7168),
        (128, 4096, 16384),
        (2048, 24576, 1536),
    ]
    .iter()
    .map(|&(m, n, k)| {
        let g = Gemm {
            m,
            n,
            k,
            in_bytes: 1,
            weights: 1,
        };
        let s = sim::compute::gemm_time(&hw, &cal, hw.sms, &g) * 1.3;
        serde_json::json!({"kernel": "gemm_fp8", "m": m, "n": n, "k": k, "groups": 1, "seconds": s})
    })
    .collect();
    let d = dir();
    let f = d.join("gemm.json");
    std::fs::write(&f, serde_json::to_string(&rows).unwrap()).unwrap();
    let prof = d.join("profile.toml");
    let out = ptxforge(&[
        "sim",
        "--calibrate",
        f.to_str().unwrap(),
        "--out",
        prof.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&prof).unwrap();
    assert!(
        text.contains("[gemm]") && text.contains("gemm_samples = 5"),
        "{text}"
    );
    let base = ok_json(&["sim", "v3", "--json"]);
    let slow = ok_json(&["sim", "v3", "--hardware", prof.to_str().unwrap(), "--json"]);
    let t = |v: &serde_json::Value| v["report"]["step_time_s"].as_f64().unwrap();
    assert!(
        t(&slow) > t(&base),
        "slower GEMMs: {} vs {}",
        t(&slow),
        t(&base)
    );
    let s = ok_json(&[
        "sim",
        "v3-serve",
        "--hardware",
        prof.to_str().unwrap(),
        "--json",
    ]);
    assert!(
        s["report"]["prefill"]["input_tokens_per_s_per_node"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    fails_with(
        &["sim", "--calibrate", "/nonexistent/g.json"],
        "/nonexistent/g.json",
    );
}

#[test]
fn tables_reproduce_deepep_within_15_percent() {
    let v = ok_json(&["sim", "--tables", "--json"]);
    let rows = v["deepep"].as_array().unwrap();
    assert_eq!(rows.len(), 20);
    for r in rows {
        assert!(r["error"].as_f64().unwrap().abs() <= 0.15, "{r}");
    }
    assert_eq!(v["deepgemm"].as_array().unwrap().len(), 7);
}

/// A real `ptxforge moe --json` run (2 emulated nodes x 2 GPUs) is a valid calibration input:
/// its dispatch and combine phases become samples and the fitted model reproduces them.
#[test]
fn calibrate_reads_a_real_moe_report() {
    let d = dir();
    let args = common::small_moe(&["--json"]);
    let out = ptxforge(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let f = d.join("moe.json");
    std::fs::write(&f, &out.stdout).unwrap();
    // The simulator's record sizes are the ones the kernels moved: the same records carry
    // FP8 dispatch and BF16 combine bytes.
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let shape = sim::traffic::EpShape {
        ranks: 4,
        gpus_per_node: 2,
        experts: 16,
        hidden: 256,
        topk: 4,
    };
    let phase = |p: &str| {
        v["phases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["phase"].as_str().unwrap().starts_with(p))
            .unwrap()
            .clone()
    };
    let (disp, comb) = (phase("dispatch"), phase("combine"));
    let b = |r: &serde_json::Value, k: &str| r[k].as_u64().unwrap();
    let fp8 = shape.dispatch_record_bytes(sim::traffic::Payload::Fp8) as u64;
    let crec = shape.combine_record_bytes() as u64;
    let records = b(&disp, "inter_node_records");
    assert!(records > 0);
    assert_eq!(b(&disp, "inter_bytes"), records * fp8);
    assert_eq!(b(&comb, "inter_bytes"), records * crec);
    assert_eq!(b(&disp, "intra_bytes") % fp8, 0);
    assert_eq!(
        b(&disp, "intra_bytes") / fp8,
        b(&comb, "intra_bytes") / crec
    );
    let p = ok_json(&["sim", "--calibrate", f.to_str().unwrap(), "--json"]);
    assert_eq!(p["comm_samples"], 2, "{p}");
    assert_eq!(p["gemm_samples"], 0, "{p}");
    // The times are wall-clock times of an emulated run, so a busy host can make them
    // inconsistent with any latency + bandwidth model (for example a combine that moved more
    // bytes but finished first). The fit must then reach the best error the model allows.
    let secs = |r: &serde_json::Value| r["seconds"].as_f64().unwrap();
    let best = best_latency_bandwidth_error(secs(&disp), secs(&comb), crec as f64 / fp8 as f64);
    let err = p["comm_rms_error"].as_f64().unwrap();
    assert!(
        err < best + 0.05,
        "fit error {err}, best possible {best}: {p}"
    );
}

/// The smallest RMS relative error with which `t = latency + bytes / bandwidth` (latency and
/// bandwidth free, both non-negative) reproduces two phases whose byte counts differ by
/// `ratio` (> 1): times `t_small` (fewer bytes) and `t_large`. Zero when
/// `t_small <= t_large <= ratio * t_small`; otherwise the model's closest pair of times is
/// equal (pure latency) or in the byte ratio (pure bandwidth), placed at the geometric mean
/// as the log-error fit places it.
fn best_latency_bandwidth_error(t_small: f64, t_large: f64, ratio: f64) -> f64 {
    let scale = if t_large < t_small {
        1.0
    } else if t_large > ratio * t_small {
        ratio
    } else {
        return 0.0;
    };
    let small = (t_small * t_large / scale).sqrt();
    let (e1, e2) = (small / t_small - 1.0, small * scale / t_large - 1.0);
    ((e1 * e1 + e2 * e2) / 2.0).sqrt()
}

#[test]
fn best_latency_bandwidth_error_is_zero_only_for_consistent_times() {
    assert_eq!(best_latency_bandwidth_error(1.0, 1.5, 2.0), 0.0);
    // Combine first although it moved more: the model can only predict equal times.
    let e = best_latency_bandwidth_error(1.2, 1.0, 2.0);
    let g = (1.2f64 * 1.0).sqrt();
    let want = (((g / 1.2 - 1.0).powi(2) + (g - 1.0).powi(2)) / 2.0).sqrt();
    assert!((e - want).abs() < 1e-12 && e > 0.08, "{e}");
    // Slower than bandwidth alone explains: times in the byte ratio.
    assert!(best_latency_bandwidth_error(1.0, 3.0, 2.0) > 0.1);
}
